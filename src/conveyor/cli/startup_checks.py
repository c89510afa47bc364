"""What would make a model fail at start-up, found from its config alone (no weights, no torch).

``check-config`` and ``serve`` run these before anything loads, so a bad ``max_model_len`` or a
KV cache too small for one sequence is one line naming the model, not a traceback later.
"""

from __future__ import annotations

from conveyor.config.model_config import GenerateModelConfig, remote_model_name
from conveyor.config.settings import ServerConfig
from conveyor.engine.core.limits import kv_pool_problem, max_model_len_problem
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.vllm_mapping import VLLM_INSTALL, is_vllm_installed
from conveyor.errors import ConfigError


def generate_model_problems(config: GenerateModelConfig) -> list[str]:
    """Start-up failures of one generative model that its config and config.json (or GGUF
    metadata) reveal.

    A KV cache sized by memory fraction is only known once the device is probed, so only
    ``kv_cache_tokens`` is checked here (the engine checks the rest when it starts).
    """
    if config.engine == "vllm" and not is_vllm_installed():
        return [f"model {config.name!r}: {VLLM_INSTALL}"]
    try:
        decoder = DecoderConfig.from_hf(load_hf_config(config.path))
    except (OSError, ValueError, KeyError) as exc:
        return [f"model {config.name!r}: cannot read the checkpoint's config: {exc}"]
    checkpoint_len = decoder.max_position_embeddings
    max_model_len = config.max_model_len or checkpoint_len
    problems = [max_model_len_problem(config.name, max_model_len, checkpoint_len)]
    if config.kv_cache_tokens is not None:
        problems.append(
            kv_pool_problem(config.name, max_model_len, config.kv_cache_tokens, config.block_size)
        )
    return [problem for problem in problems if problem is not None]


def check_models(settings: ServerConfig) -> None:
    """Raise ``ConfigError`` (one line per problem) for any model that would fail to start.

    A ``conveyor://`` model has no config.json until it is pulled; the engine checks it then.
    """
    problems = [
        problem
        for model in settings.models
        if isinstance(model, GenerateModelConfig) and remote_model_name(model.path) is None
        for problem in generate_model_problems(model)
    ]
    if problems:
        raise ConfigError("\n".join(problems))
