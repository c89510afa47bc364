"""Building a ``HostedGenerator`` on vLLM's engine from an ``engine: vllm`` config entry.

Slow (vLLM imports, loads weights, profiles memory and starts its engine-core process):
call it off the event loop. Without vLLM installed it fails with one line saying what
to install.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.config.model_config import GenerateModelConfig, local_model_path
from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config, read_eos_token_ids
from conveyor.engine.model.lora.peft_format import load_peft_adapter
from conveyor.engine.model.lora.registry import LoraRegistry
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.vllm_engine import VllmEngine
from conveyor.engine.vllm_lora import null_adapter_args, write_null_adapter
from conveyor.engine.vllm_mapping import VLLM_INSTALL, engine_args, is_vllm_installed
from conveyor.errors import ConfigError, ConveyorError
from conveyor.observability.metrics import GeneratorMetrics

__all__ = ["load_vllm_generator"]


def load_vllm_generator(config: GenerateModelConfig, metrics: GeneratorMetrics) -> HostedGenerator:
    """Start vLLM's ``AsyncLLM`` for ``config`` and wrap it (slow: off the loop)."""
    if not is_vllm_installed():
        raise ConfigError(f"model {config.name}: {VLLM_INSTALL}")
    try:
        args = engine_args(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    lora = _lora_registry(config)  # before vLLM's slow start: a bad adapter stops it at once
    base_lora = None
    if lora is not None and _is_cpu():  # see vllm_lora: base rows need an adapter there
        args = null_adapter_args(args)
        base_lora = _lora_request(**_null_adapter(config))
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
        lora=lora, new_lora=_lora_request, base_lora=base_lora,
    )  # fmt: skip
    metrics.reports_vllm_names = True
    vocab_size = int(model.get_vocab_size())
    return HostedGenerator(
        config, engine, tokenizer, metrics, vocab_size, int(time.time()),
        lora=lora, adapter_sync=None if lora is None else engine,
    )  # fmt: skip


def _lora_registry(config: GenerateModelConfig) -> LoraRegistry[None] | None:
    """The model's adapters, checked as Conveyor's engine checks them; None without ``lora``.

    The registry holds no weights (vLLM reads the directory itself): its loader reads and
    checks the files (rank, options, size bounds, names and shapes against the base) so an
    adapter is refused with the same 400 on either engine. The configured adapters are
    registered here and added to vLLM before their first request (vLLM's engine is only
    reached from the event loop).
    """
    if config.lora is None:
        return None
    settings = config.lora
    decoder = DecoderConfig.from_hf(load_hf_config(local_model_path(config.path)))

    def check(path: Path) -> tuple[int, None]:
        weights = load_peft_adapter(
            path, decoder, max_rank=settings.max_rank, max_bytes=settings.max_adapter_bytes
        )
        return weights.rank, None

    registry: LoraRegistry[None] = LoraRegistry(check, max_cpu_loras=settings.max_cpu_loras)
    for name, adapter_path in settings.adapters.items():
        try:
            registry.load(name, adapter_path)
        except ConveyorError as exc:
            raise ConfigError(
                f"model {config.name}: LoRA adapter {name!r}: {exc.message}"
            ) from None
    return registry


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


def _is_cpu() -> bool:
    """Whether vLLM runs on its CPU platform here."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _null_adapter(config: GenerateModelConfig) -> dict[str, Any]:
    """Write the null adapter into a directory removed at exit; its LoRARequest keywords."""
    directory = Path(tempfile.mkdtemp(prefix="conveyor-null-lora-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    decoder = DecoderConfig.from_hf(load_hf_config(local_model_path(config.path)))
    return write_null_adapter(directory, decoder)


def _lora_request(**fields: Any) -> Any:
    """vLLM's ``LoRARequest`` from ``vllm_mapping.lora_request_fields``' dictionary."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(**fields)


def _sampling_params(kwargs: dict[str, Any]) -> Any:
    """vLLM's ``SamplingParams`` from ``vllm_mapping.sampling_kwargs``' dictionary."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    kwargs = dict(kwargs)
    structured = kwargs.pop("structured", None)
    if structured is not None:
        kwargs["structured_outputs"] = StructuredOutputsParams(grammar=structured)
    return SamplingParams(output_kind=RequestOutputKind.DELTA, **kwargs)
