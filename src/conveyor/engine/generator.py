"""A generative model as the service hosts it: config, engine, tokenizer and metrics.

:meth:`HostedGenerator.submit` is the one door requests come in by, with the queue bound
(429) and the first-token deadline (504). Torch-free to import: ``generator_factory``
builds one from a ``kind: generate`` config entry.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.config.model_config import GenerateModelConfig
from conveyor.engine.core.siblings import prefix_groups
from conveyor.engine.model.lora.registry import AdapterEntry, LoraRegistry
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import InvalidRequest, QueueFull
from conveyor.input_limits import input_byte_limit
from conveyor.observability.metrics import GeneratorMetrics
from conveyor.priority import Priority

if TYPE_CHECKING:  # only named in annotations: callers of submit() need not load torch
    from conveyor.engine.engine_protocol import AdapterSync, GenerationEngine

__all__ = ["HostedGenerator"]


@dataclass(slots=True)
class HostedGenerator:
    """A loaded generative model: its engine (already stepping) and what requests need.

    The engine is Conveyor's ``LLMEngine`` or, with ``engine: vllm``, ``VllmEngine``.
    """

    config: GenerateModelConfig
    engine: GenerationEngine
    tokenizer: Tokenizer
    metrics: GeneratorMetrics
    vocab_size: int
    created_at: int
    # The model's LoRA adapters (None: it serves none), and the one this view runs with.
    lora: LoraRegistry[Any] | None = None
    adapter: AdapterEntry | None = None
    # An engine with its own adapter table (vLLM's), told of run-time loads and unloads.
    adapter_sync: AdapterSync | None = None

    def for_adapter(self, name: str) -> HostedGenerator | None:
        """This model as adapter ``name`` serves it; None if it has no such adapter."""
        entry = None if self.lora is None else self.lora.get(name)
        return None if entry is None else dataclasses.replace(self, adapter=entry)

    def adapter_names(self) -> list[str]:
        """The LoRA adapters this model serves now."""
        return [] if self.lora is None else self.lora.names()

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus output this model serves."""
        return self.engine.config.max_model_len

    @property
    def max_input_bytes(self) -> int:
        """Most UTF-8 bytes of prompt text a request may carry (refused before tokenizing)."""
        return input_byte_limit(self.config.max_input_bytes, self.max_model_len)

    def submit(
        self,
        prompts: Sequence[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        priority: Priority = Priority.ONLINE,
        timeout_ms: float | None = None,
    ) -> GenerationStream:
        """Queue one request per prompt, all on one stream; call on the event loop.

        Raises 429 when the waiting queue would exceed ``max_queue`` and 400 for a
        prompt the engine cannot run. ``params`` is one for all prompts or one per prompt.
        The stream fails with 504 if no token has come by the deadline (``timeout_ms``,
        default the model's), and with 400 at once for a prompt whose prefill alone
        would outlast it (``prefill_time``).
        """
        if not prompts:
            raise InvalidRequest("at least one prompt is needed", param="prompt")
        timeout_s = (timeout_ms or self.config.timeout_ms) / 1000
        self._check_queue(len(prompts))
        if priority is Priority.ONLINE:
            self._check_wait(len(prompts), timeout_s)
        base_id = uuid.uuid4().hex
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        if len(per_prompt) != len(prompts):
            raise ValueError("need one params for all prompts or one per prompt")
        groups = prefix_groups(base_id, prompts)
        deadline_s = time.monotonic() + timeout_s
        try:
            requests = [
                self.engine.new_request(
                    f"{base_id}-{index}",
                    list(ids),
                    choice,
                    priority=priority,
                    index=index,
                    prefix_group=groups[index],
                    adapter_id=0 if self.adapter is None else self.adapter.adapter_id,
                    deadline_s=deadline_s,
                )
                for index, (ids, choice) in enumerate(zip(prompts, per_prompt, strict=True))
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
        stream.set_deadline(stream.loop.time() + timeout_s)
        return stream

    def _check_queue(self, num_new: int) -> None:
        """429 with Retry-After when admitting ``num_new`` more would overflow the queue.

        More than the queue can ever hold is a 400 instead: retrying would never help.
        """
        if num_new > self.config.max_queue:
            raise InvalidRequest(
                f"too many prompts: {num_new} (this model queues at most {self.config.max_queue})",
                param="prompt",
            )
        num_waiting = self.engine.num_waiting
        if num_waiting + num_new > self.config.max_queue:
            raise QueueFull(
                f"model {self.config.name!r} queue is full ({num_waiting} requests waiting, "
                f"at most {self.config.max_queue})",
                retry_after_s=max(1, round(self.engine.estimated_drain_s())),
            )

    def _check_wait(self, num_new: int, timeout_s: float) -> None:
        """429 when the seats measured to come free would not reach these in time.

        Over capacity, not a timeout: admitted, they would wait out their deadline and get
        504 (the wait behind the online requests already waiting, by the turnover the engine
        measured while saturated; batch lines wait longer and are not refused by it).
        """
        wait_s = self.engine.predicted_online_wait_s(num_new)
        if wait_s is not None and wait_s > timeout_s:
            raise QueueFull(
                f"model {self.config.name!r} is over capacity: the predicted wait for a seat "
                f"({wait_s * 1000:.0f} ms) exceeds the request's deadline "
                f"({timeout_s * 1000:.0f} ms)",
                retry_after_s=max(1, round(self.engine.estimated_drain_s())),
                code="deadline_unreachable",
            )

    def stop(self) -> None:
        """Stop the engine; unfinished requests get 503 (blocking: call off the loop)."""
        self.engine.stop()
