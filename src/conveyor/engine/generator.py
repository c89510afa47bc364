"""A generative model as the service hosts it: config, engine, tokenizer and metrics.

:func:`load_generator` builds everything from a ``kind: generate`` config entry (slow:
call it off the event loop); :meth:`HostedGenerator.submit` is the one door requests
come in by, with the queue bound (429) and the first-token deadline (504).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.config import GenerateModelConfig
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.sampling import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import InvalidRequest, QueueFull
from conveyor.metrics import GeneratorMetrics
from conveyor.priority import Priority

__all__ = ["DEFAULT_CPU_KV_CACHE_TOKENS", "HostedGenerator", "load_generator"]

# KV cache size when the config names none and the device is not CUDA.
DEFAULT_CPU_KV_CACHE_TOKENS = 16384
DEFAULT_CUDA_MEMORY_FRACTION = 0.9


@dataclass(slots=True)
class HostedGenerator:
    """A loaded generative model: its engine (already stepping) and what requests need."""

    config: GenerateModelConfig
    engine: LLMEngine
    tokenizer: Tokenizer
    metrics: GeneratorMetrics
    vocab_size: int
    created_at: int

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus output this model serves."""
        return self.engine.config.max_model_len

    def submit(
        self,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        *,
        priority: Priority = Priority.ONLINE,
        timeout_ms: float | None = None,
    ) -> GenerationStream:
        """Queue one request per prompt, all on one stream; call on the event loop.

        Raises 429 when the waiting queue would exceed ``max_queue`` and 400 for a
        prompt the engine cannot run. The stream fails with 504 if no token has come
        by the deadline (``timeout_ms``, default the model's).
        """
        if not prompts:
            raise InvalidRequest("at least one prompt is needed", param="prompt")
        self._check_queue(len(prompts))
        base_id = uuid.uuid4().hex
        try:
            requests = [
                self.engine.new_request(
                    f"{base_id}-{index}", list(ids), params, priority=priority, index=index
                )
                for index, ids in enumerate(prompts)
            ]
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="prompt") from None
        stream = GenerationStream(len(requests))
        engine = self.engine

        def abort_all() -> None:
            for request in requests:
                engine.abort(request.request_id)

        stream.set_on_abort(abort_all)
        try:
            for request in requests:
                engine.add_request(request, stream)
        except BaseException:
            stream.close()  # aborts the prompts that did get queued
            raise
        deadline_s = (timeout_ms or self.config.timeout_ms) / 1000
        stream.set_deadline(stream.loop.time() + deadline_s)
        return stream

    def _check_queue(self, num_new: int) -> None:
        """429 with Retry-After when admitting ``num_new`` more would overflow the queue."""
        num_waiting = self.engine.num_waiting
        if num_waiting + num_new > self.config.max_queue:
            raise QueueFull(
                f"model {self.config.name!r} queue is full ({num_waiting} requests waiting, "
                f"at most {self.config.max_queue})",
                retry_after_s=max(1, round(self.engine.estimated_drain_s())),
            )

    def stop(self) -> None:
        """Stop the engine; unfinished requests get 503 (blocking: call off the loop)."""
        self.engine.stop()


def load_generator(config: GenerateModelConfig, metrics: GeneratorMetrics) -> HostedGenerator:
    """Load the checkpoint, size the KV cache, start the engine thread (slow: off the loop)."""
    import torch

    from conveyor.engine.model_runner import ModelRunner, resolve_device

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    num_kv_blocks = _num_kv_blocks(config, device.type)
    runner = ModelRunner(
        config.path,
        num_kv_blocks=num_kv_blocks,
        block_size=config.block_size,
        device=device,
        dtype=config.dtype,
    )
    max_model_len = config.max_model_len or runner.max_model_len
    if max_model_len > runner.max_model_len:
        raise ValueError(
            f"model {config.name!r}: max_model_len {max_model_len} exceeds the checkpoint's "
            f"{runner.max_model_len}"
        )
    engine_config = EngineConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        block_size=config.block_size,
    )
    tokenizer = Tokenizer(config.path)
    engine = LLMEngine(runner, tokenizer, engine_config, metrics=metrics, name=config.name)
    engine.start()
    return HostedGenerator(
        config, engine, tokenizer, metrics, runner.vocab_size, created_at=int(time.time())
    )


def _num_kv_blocks(config: GenerateModelConfig, device_type: str) -> int:
    """Blocks from ``kv_cache_tokens``, or from a memory fraction on CUDA."""
    from conveyor.engine.hf_config import DecoderConfig, load_hf_config
    from conveyor.engine.model_runner import (
        num_kv_blocks_for_memory_fraction,
        num_kv_blocks_for_tokens,
    )

    fraction = config.kv_cache_memory_fraction
    if config.kv_cache_tokens is None and fraction is None and device_type == "cuda":
        fraction = DEFAULT_CUDA_MEMORY_FRACTION
    if fraction is not None:
        return num_kv_blocks_for_memory_fraction(
            config.path,
            block_size=config.block_size,
            memory_fraction=fraction,
            device=config.device,
            dtype=config.dtype,
        )
    tokens = config.kv_cache_tokens
    if tokens is None:
        model_len = DecoderConfig.from_hf(load_hf_config(config.path)).max_position_embeddings
        tokens = max(DEFAULT_CPU_KV_CACHE_TOKENS, config.max_model_len or model_len)
    return num_kv_blocks_for_tokens(tokens, config.block_size)
