"""Building a ``HostedGenerator`` from its config entry: KV-cache size, checkpoint, engine.

Slow (it loads weights and starts the engine thread): call it off the event loop.
"""

from __future__ import annotations

import logging
import time

import torch

from conveyor.config.model_config import GenerateModelConfig, KVOffloadConfig, local_model_path
from conveyor.engine.core.kv_tier import TierIndex
from conveyor.engine.core.limits import max_model_len_problem
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.cpu_threads import engine_threads
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.kv_offload import KVOffload
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.kv_sizing import (
    num_kv_blocks_for_memory_fraction,
    num_kv_blocks_for_tokens,
    resolve_device,
    resolve_dtype,
)
from conveyor.engine.model.kv_store import HostKVStore
from conveyor.engine.model.layers.varlen_kernels import VarlenUnavailable
from conveyor.engine.model.lora.runtime import LoraRuntime, new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.warm_up import warm_up_chunks
from conveyor.errors import ConfigError, ConveyorError
from conveyor.observability.metrics import GeneratorMetrics
from conveyor.observability.vllm_names import AdapterActivity

__all__ = ["DEFAULT_CPU_KV_CACHE_TOKENS", "load_generator"]

_log = logging.getLogger(__name__)

# KV cache size when the config names none and the device is not CUDA.
DEFAULT_CPU_KV_CACHE_TOKENS = 16384
DEFAULT_CUDA_MEMORY_FRACTION = 0.9


def load_generator(config: GenerateModelConfig, metrics: GeneratorMetrics) -> HostedGenerator:
    """Load the checkpoint, size the KV cache, start the engine thread (slow: off the loop)."""
    threads = engine_threads(config.threads, config.cpu_cores)
    if threads is not None:  # the loading thread's ops (the engine thread sets its own)
        torch.set_num_threads(threads)
    device = resolve_device(config.device)
    num_kv_blocks = _num_kv_blocks(config, device.type)
    lora = _lora_runtime(config, device)
    runner = _runner(config, device, num_kv_blocks, lora)
    max_model_len = config.max_model_len or runner.max_model_len
    problem = max_model_len_problem(config.name, max_model_len, runner.max_model_len)
    if problem is not None:
        raise ConfigError(problem)
    engine_config = EngineConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        block_size=config.block_size,
        job_tokens_beside_online=config.job_tokens_beside_online,
        max_loras_per_batch=None if config.lora is None else config.lora.max_loras_per_batch,
        threads=threads,
        cpu_cores=tuple(config.cpu_cores) if config.cpu_cores else None,
        arrival_window_s=config.arrival_window_ms / 1000,
        arrival_quiet_s=None if config.arrival_quiet_ms is None else config.arrival_quiet_ms / 1000,
        warm_up_chunks=_warm_up(config, runner, max_model_len, num_kv_blocks),
        warm_up_rows=0 if config.warm_up_tokens == 0 else config.max_num_batched_tokens,
    )
    tokenizer = Tokenizer(local_model_path(config.path))
    if lora is not None and config.lora is not None:
        slots = config.lora.max_loras_per_batch
        metrics.adapters = AdapterActivity(slots, lora.registry.names_by_id)
    engine = LLMEngine(
        runner, tokenizer, engine_config, metrics=metrics, name=config.name,
        kv_offload=_kv_offload(config.kv_offload, runner),
    )  # fmt: skip
    engine.start()
    registry = None if lora is None else lora.registry
    return HostedGenerator(
        config, engine, tokenizer, metrics, runner.vocab_size, int(time.time()), registry
    )


def _runner(
    config: GenerateModelConfig, device: torch.device, num_kv_blocks: int, lora: LoraRuntime | None
) -> ModelRunner:
    """The model on its device with its KV cache; a named attention backend that cannot
    serve it is a configuration error."""
    try:
        runner = ModelRunner(
            local_model_path(config.path),
            num_kv_blocks=num_kv_blocks,
            block_size=config.block_size,
            device=device,
            dtype=config.dtype,
            lora=lora,
            enforce_eager=config.enforce_eager,
            native_kernels=config.native_kernels,
            attention_backend=config.attention_backend,
            decode_graph_rows=config.max_num_seqs if config.cuda_graphs else 0,
            row_buckets_up_to=config.row_buckets_up_to,
        )
    except VarlenUnavailable as error:
        raise ConfigError(
            f"model {config.name!r}: attention_backend {config.attention_backend}: {error}"
        ) from error
    _log.info("model %s attends with %s", config.name, runner.attention_reason)
    if runner.decode_graphs is not None:
        sizes = runner.decode_graphs.sizes
        _log.info(
            "model %s: %d decode graphs (1 to %d rows) captured in %.1f s",
            config.name, len(sizes), sizes[-1], runner.graph_capture_s,
        )  # fmt: skip
    return runner


def _warm_up(
    config: GenerateModelConfig, runner: ModelRunner, max_model_len: int, num_kv_blocks: int
) -> tuple[SeqChunk, ...]:
    """The engine's first step (``engine.warm_up``): ``warm_up_tokens``, by default a full
    step's."""
    num_tokens = config.warm_up_tokens
    return warm_up_chunks(
        config.max_num_batched_tokens if num_tokens is None else num_tokens,
        max_model_len=max_model_len,
        block_size=config.block_size,
        num_kv_blocks=num_kv_blocks,
        vocab_size=runner.vocab_size,
    )


def _kv_offload(config: KVOffloadConfig | None, runner: ModelRunner) -> KVOffload | None:
    """The second KV tier sized from its byte budgets; None without ``kv_offload``."""
    if config is None:
        return None
    block_bytes = runner.kv_cache_bytes // runner.num_kv_blocks
    host_blocks = config.host_bytes // block_bytes
    if host_blocks < 1:
        raise ConfigError(
            f"kv_offload.host_bytes {config.host_bytes} is less than one KV block "
            f"({block_bytes} bytes)"
        )
    disk_blocks = config.disk_bytes // block_bytes
    store = HostKVStore(runner.kv_cache, host_blocks, config.disk_path if disk_blocks else None)
    return KVOffload(TierIndex(host_blocks, disk_blocks), store)


def _lora_runtime(config: GenerateModelConfig, device: torch.device) -> LoraRuntime | None:
    """The adapters' runtime with the configured adapters loaded; None without ``lora``."""
    if config.lora is None:
        return None
    path = local_model_path(config.path)
    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(path)),
        slots=config.lora.max_loras_per_batch,
        max_cpu_loras=config.lora.max_cpu_loras,
        max_rank=config.lora.max_rank,
        max_adapter_bytes=config.lora.max_adapter_bytes,
        device=device,
        dtype=resolve_dtype(config.dtype, device),
    )
    for name, adapter_path in config.lora.adapters.items():
        try:
            lora.registry.load(name, adapter_path)
        except ConveyorError as exc:
            raise ConfigError(
                f"model {config.name}: LoRA adapter {name!r}: {exc.message}"
            ) from None
    return lora


def _num_kv_blocks(config: GenerateModelConfig, device_type: str) -> int:
    """Blocks from ``kv_cache_tokens``, or from a memory fraction on CUDA."""
    fraction = config.kv_cache_memory_fraction
    if config.kv_cache_tokens is None and fraction is None and device_type == "cuda":
        fraction = DEFAULT_CUDA_MEMORY_FRACTION
    if fraction is not None:
        return num_kv_blocks_for_memory_fraction(
            local_model_path(config.path),
            block_size=config.block_size,
            memory_fraction=fraction,
            device=config.device,
            dtype=config.dtype,
        )
    tokens = config.kv_cache_tokens
    if tokens is None:
        model_len = DecoderConfig.from_hf(
            load_hf_config(local_model_path(config.path))
        ).max_position_embeddings
        tokens = max(DEFAULT_CPU_KV_CACHE_TOKENS, config.max_model_len or model_len)
    return num_kv_blocks_for_tokens(tokens, config.block_size)
