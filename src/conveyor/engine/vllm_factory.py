"""Building a ``HostedGenerator`` on vLLM's engine from an ``engine: vllm`` config entry.

Slow (vLLM imports, loads weights, profiles memory and starts its engine-core process):
call it off the event loop. Without vLLM installed it fails with one line saying what
to install.
"""

from __future__ import annotations

import time
from typing import Any

from conveyor.config.model_config import GenerateModelConfig, local_model_path
from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.model.hf_config import load_hf_config, read_eos_token_ids
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.vllm_engine import VllmEngine
from conveyor.engine.vllm_mapping import VLLM_INSTALL, engine_args, is_vllm_installed
from conveyor.errors import ConfigError
from conveyor.observability.metrics import GeneratorMetrics

__all__ = ["load_vllm_generator"]


def load_vllm_generator(config: GenerateModelConfig, metrics: GeneratorMetrics) -> HostedGenerator:
    """Start vLLM's ``AsyncLLM`` for ``config`` and wrap it (slow: off the loop)."""
    if not is_vllm_installed():
        raise ConfigError(f"model {config.name}: {VLLM_INSTALL}")
    if config.lora is not None:
        raise ConfigError(f"model {config.name}: LoRA adapters on engine: vllm are not yet served")
    try:
        args = engine_args(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    llm = _start(args)
    vllm_config = llm.vllm_config
    cache, model = vllm_config.cache_config, vllm_config.model_config
    scheduler = vllm_config.scheduler_config
    engine_config = EngineConfig(
        max_num_seqs=scheduler.max_num_seqs,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        num_kv_blocks=int(cache.num_gpu_blocks or 0),
        block_size=int(cache.block_size),
    )
    path = local_model_path(config.path)
    tokenizer = Tokenizer(path)
    # The same end-of-sequence tokens as Conveyor's engine (its runner's and tokenizer's).
    eos = set(read_eos_token_ids(path, load_hf_config(path)))
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    engine = VllmEngine(
        llm, _sampling_params, tokenizer, engine_config,
        eos_token_ids=frozenset(eos), metrics=metrics, name=config.name,
    )  # fmt: skip
    metrics.reports_vllm_names = True
    vocab_size = int(model.get_vocab_size())
    return HostedGenerator(config, engine, tokenizer, metrics, vocab_size, int(time.time()))


def _start(args: dict[str, Any]) -> Any:
    """vLLM's started ``AsyncLLM`` for engine arguments ``args``."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    structured = args.get("structured_outputs_config")
    if isinstance(structured, dict):
        args = {**args, "structured_outputs_config": StructuredOutputsConfig(**structured)}
    try:
        engine_args = AsyncEngineArgs(**args)
    except TypeError as exc:
        raise ConfigError(f"vllm: an engine argument vLLM does not know: {exc}") from None
    return AsyncLLM.from_engine_args(engine_args)


def _sampling_params(kwargs: dict[str, Any]) -> Any:
    """vLLM's ``SamplingParams`` from ``vllm_mapping.sampling_kwargs``' dictionary."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    kwargs = dict(kwargs)
    structured = kwargs.pop("structured", None)
    if structured is not None:
        kwargs["structured_outputs"] = StructuredOutputsParams(grammar=structured)
    return SamplingParams(output_kind=RequestOutputKind.DELTA, **kwargs)
