"""``engine: vllm``: vLLM's ``AsyncLLM`` in-process, behind Conveyor's engine protocol.

Each request is one task on the event loop that iterates vLLM's ``generate``. vLLM
samples (priority scheduling: online before batch); Conveyor's ``GenerationRequest``
turns the tokens into text, finds stop strings and builds the same outputs as its own
engine, so every endpoint reads either engine alike. Closing a stream (a client gone, a
deadline, a stop string) cancels the task, which aborts the request inside vLLM.

LoRA adapters: Conveyor's ``LoraRegistry`` names them and checks their files; each is
added to vLLM (``add_lora``) once, when loaded at run time or before its first request,
and a request for it carries its ``LoRARequest`` (see ``vllm_mapping.lora_request_fields``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.engine_metrics import record_finish
from conveyor.engine.model.lora.files import AdapterError
from conveyor.engine.model.lora.registry import AdapterEntry, LoraRegistry
from conveyor.engine.outputs import FinishReason, GenerationOutput, TokenLogprobs
from conveyor.engine.request import GenerationRequest
from conveyor.engine.sampling.grammar import GrammarCompiler
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream, deliver_threadsafe
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.vllm_mapping import (
    finish_reason,
    lora_request_fields,
    prompt_entries,
    sampling_kwargs,
    token_logprobs,
    vllm_priority,
)
from conveyor.errors import ConveyorError, InvalidRequest, ModelFault, ServiceUnavailable
from conveyor.observability.context import current_request
from conveyor.observability.metrics import GeneratorMetrics
from conveyor.priority import Priority

__all__ = ["VllmEngine"]

log = logging.getLogger(__name__)


class VllmEngine:
    """One model on vLLM's engine; the methods of ``GenerationEngine`` (see there).

    ``llm`` is a started ``vllm.v1.engine.async_llm.AsyncLLM``; ``new_params`` builds
    vLLM's ``SamplingParams`` from :func:`sampling_kwargs`' dictionary. With ``lora`` (the
    model's adapters), ``new_lora`` builds vLLM's ``LoRARequest`` from
    :func:`lora_request_fields`' dictionary; ``base_lora``, if given, is the ``LoRARequest``
    base requests run under (see ``vllm_lora``).
    """

    def __init__(
        self,
        llm: Any,
        new_params: Any,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        eos_token_ids: frozenset[int],
        metrics: GeneratorMetrics,
        name: str,
        lora: LoraRegistry[Any] | None = None,
        new_lora: Callable[..., Any] = dict,
        base_lora: Any = None,
    ) -> None:
        self.config = config
        self.name = name
        self.eos_token_ids = eos_token_ids
        self.grammars = GrammarCompiler(
            tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=eos_token_ids
        )
        # vLLM keeps its prefix cache to itself: nothing to advertise for prefix routing.
        self.prefix_digest = PrefixDigest(0)
        self._llm = llm
        self._new_params = new_params
        self._tokenizer = tokenizer
        self._metrics = metrics
        self._tasks: dict[str, tuple[asyncio.Task[None], GenerationStream]] = {}
        self._num_waiting = 0
        self._batch_ids: set[str] = set()  # batch-job requests among the tasks
        self._is_stopped = False
        self._lora = lora
        self._new_lora = new_lora
        # Per adapter id: its LoRARequest, and the task adding it to vLLM.
        self._lora_requests: dict[int, Any] = {}
        self._lora_names: dict[str, int] = {}  # vLLM's adapter names -> adapter ids
        self._adding: dict[int, asyncio.Task[None]] = {}
        # The adapter base requests run under (vLLM's CPU build: see ``vllm_lora``), if any.
        self._base_adapter_id = 0 if base_lora is None else int(base_lora.lora_int_id)
        if base_lora is not None:
            self._lora_requests[self._base_adapter_id] = base_lora

    @property
    def num_waiting(self) -> int:
        """Requests given to vLLM that have no output yet (queued or in prefill)."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Requests that have had their first output and are not finished."""
        return len(self._tasks) - self._num_waiting

    @property
    def num_batch(self) -> int:
        """Batch-job requests given to vLLM and not finished."""
        return len(self._batch_ids)

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in vLLM's KV cache."""
        return self.config.num_kv_blocks

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: Priority = Priority.ONLINE,
        index: int = 0,
        prefix_group: str | None = None,
        adapter_id: int = 0,
        deadline_s: float | None = None,
    ) -> GenerationRequest:
        """Build a request; ValueError if it cannot run (too long, empty, no such adapter)."""
        if adapter_id:
            self._lora_request(adapter_id)
        return GenerationRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            params=params,
            tokenizer=self._tokenizer,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.config.max_model_len,
            arrival_s=time.monotonic(),
            priority=priority,
            index=index,
            prefix_group=prefix_group,
            origin=current_request(),
            deadline_s=deadline_s,
            adapter_id=adapter_id,
        )

    def add_request(self, request: GenerationRequest, stream: GenerationStream) -> None:
        """Start the request's task on the stream's loop (call on that loop)."""
        if self._is_stopped:
            raise ServiceUnavailable(f"model {self.name!r} is shutting down")
        try:
            params = self._new_params(sampling_kwargs(request.params, request.max_output_tokens))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        task = stream.loop.create_task(self._run(request, params, stream))
        self._tasks[request.request_id] = (task, stream)
        if request.priority is Priority.BATCH:
            self._batch_ids.add(request.request_id)
        self._num_waiting += 1
        self._metrics.prompt_tokens.inc(len(request.prompt_token_ids))
        self._publish()

    def abort(self, request_id: str) -> None:
        """Cancel the request's task (vLLM aborts it); unknown ids are ignored."""
        entry = self._tasks.get(request_id)
        if entry is not None:
            entry[0].get_loop().call_soon_threadsafe(entry[0].cancel)

    def estimated_drain_s(self) -> float:
        """Rough seconds until the waiting requests are admitted (not measured on vLLM)."""
        return float(self._num_waiting) / max(1, self.config.max_num_seqs)

    def predicted_online_wait_s(self, num_new: int) -> float | None:
        """Not measured on vLLM: requests wait for their deadline instead."""
        return None

    def stop(self) -> None:
        """Shut vLLM down; unfinished requests get 503 (blocking: call off the loop)."""
        self._is_stopped = True
        error = ServiceUnavailable(f"model {self.name!r} is shutting down")
        deliver_threadsafe((stream, error) for _, stream in list(self._tasks.values()))
        for request_id in list(self._tasks):
            self.abort(request_id)
        self._llm.shutdown()

    # -- LoRA adapters, on the loop ----------------------------------------------------

    async def add_adapter(self, entry: AdapterEntry) -> None:
        """Load a newly registered adapter into vLLM (``add_lora``); 400 if vLLM cannot."""
        self._lora_request(entry.adapter_id)
        await self._added(entry.adapter_id)

    async def remove_adapter(self, entry: AdapterEntry) -> None:
        """Drop an unloaded adapter from vLLM (``remove_lora``).

        Requests already queued for it still run: they add it again (vLLM reads it anew).
        """
        self._adding.pop(entry.adapter_id, None)
        if entry.adapter_id in self._lora_requests:
            await self._llm.remove_lora(entry.adapter_id)

    def _lora_request(self, adapter_id: int) -> Any:
        """vLLM's ``LoRARequest`` for a registered adapter; ValueError for an unknown id."""
        lora = self._lora_requests.get(adapter_id)
        if lora is not None:
            return lora
        entry = None if self._lora is None else self._lora.entry(adapter_id)
        if entry is None:
            raise ValueError(f"model {self.name!r} has no LoRA adapter of id {adapter_id}")
        fields = lora_request_fields(entry, self._lora_names)
        lora = self._new_lora(**fields)
        self._lora_names.setdefault(fields["lora_name"], adapter_id)
        self._lora_requests[adapter_id] = lora
        return lora

    def _added(self, adapter_id: int) -> asyncio.Task[None]:
        """The task adding an adapter to vLLM: the one started before, unless that failed."""
        task = self._adding.get(adapter_id)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._add_lora(adapter_id))
            self._adding[adapter_id] = task
        return task

    async def _add_lora(self, adapter_id: int) -> None:
        """``add_lora``; vLLM's refusal as a 400 naming the adapter (logged in full)."""
        lora = self._lora_requests[adapter_id]
        entry = None if self._lora is None else self._lora.entry(adapter_id)
        name = "the base model's null adapter" if entry is None else repr(entry.name)
        try:
            is_added = await self._llm.add_lora(lora)
        except Exception as exc:
            log.warning("model %s: vLLM cannot load LoRA adapter %s: %s", self.name, lora, exc)
            raise AdapterError(  # the reason may name files: the log has it, not the caller
                f"vLLM cannot load the LoRA adapter {name}", param="lora_path"
            ) from None
        if not is_added:
            raise AdapterError(f"vLLM did not load the LoRA adapter {name}", param="lora_path")

    # -- the request's task, on the loop ------------------------------------------------

    async def _run(self, request: GenerationRequest, params: Any, stream: GenerationStream) -> None:
        """Generate, hand each output to the stream, count the ending."""
        is_waiting = True
        try:
            adapter_id = request.adapter_id or self._base_adapter_id
            lora = self._lora_requests.get(adapter_id) if adapter_id else None
            if lora is not None:  # added once; a cancelled request leaves the add running
                await asyncio.shield(self._added(adapter_id))
            prompt = {"prompt_token_ids": request.prompt_token_ids}
            outputs = self._llm.generate(
                prompt, params, request.request_id,
                priority=vllm_priority(request.priority), lora_request=lora,
            )  # fmt: skip
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    if is_waiting:
                        is_waiting = False
                        self._num_waiting -= 1
                    for item in self._absorb(request, out):
                        stream.put(item)
                    if request.is_finished and not out.finished:
                        break  # a stop string: leaving aborts it in vLLM
            if request.is_finished:
                record_finish(self._metrics, request)
            else:  # vLLM ended it without a reason Conveyor can name (aborted inside)
                raise ModelFault("vLLM ended the request without finishing it")
        except asyncio.CancelledError:
            self._metrics.finished["abort"].inc()  # the caller closed the stream
        except ConveyorError as exc:
            self._metrics.finished["error"].inc()
            stream.put(exc)
        except Exception as exc:
            log.exception("model %s: vLLM failed a request", self.name)
            self._metrics.finished["error"].inc()
            stream.put(_vllm_error(exc))
        finally:
            self._tasks.pop(request.request_id, None)
            self._batch_ids.discard(request.request_id)
            self._num_waiting -= is_waiting
            self._publish()

    def _absorb(self, request: GenerationRequest, out: Any) -> list[GenerationOutput]:
        """Conveyor's outputs for one vLLM delta (one or more new tokens)."""
        now_s = time.monotonic()
        completion = out.outputs[0]
        if request.first_token_s is None and out.prompt_logprobs is not None:
            num_top = request.params.prompt_logprobs or 0
            positions = [None if p is None else _entries(p) for p in out.prompt_logprobs]
            request.prompt_scores = prompt_entries(request.prompt_token_ids, positions, num_top)
        if request.max_output_tokens == 0:  # prompt logprobs only: the token is dropped
            return [request.final_output(FinishReason.LENGTH, now_s)]
        self._charge(request, now_s)
        results = []
        logprobs = completion.logprobs
        for position, token_id in enumerate(completion.token_ids):
            chosen = (
                None if logprobs is None else self._logprobs(request, token_id, logprobs[position])
            )
            results.append(self._take_token(request, token_id, chosen, now_s))
            if request.is_finished:
                return results
        reason = finish_reason(completion.finish_reason)
        if reason is not None:
            results.append(request.final_output(reason, now_s))
        return results

    def _take_token(
        self,
        request: GenerationRequest,
        token_id: int,
        logprobs: TokenLogprobs | None,
        now_s: float,
    ) -> GenerationOutput:
        """Give one token to the request; count it as Conveyor's engine does."""
        previous_s = request.last_token_s
        request.seq.append_token(token_id)
        output = request.add_token(token_id, logprobs, now_s)
        self._metrics.generated_tokens.inc()
        if previous_s is None:
            waited_s = now_s - request.arrival_s
            self._metrics.time_to_first_token_s[request.priority].observe(waited_s)
        else:
            self._metrics.time_per_output_token_s[request.priority].observe(now_s - previous_s)
        return output

    @staticmethod
    def _logprobs(request: GenerationRequest, token_id: int, position: Any) -> TokenLogprobs:
        """One position's logprobs in Conveyor's terms."""
        return token_logprobs(token_id, _entries(position), request.params.logprobs or 0)

    def _charge(self, request: GenerationRequest, now_s: float) -> None:
        """The request's share of model time: since its last output, split by the running."""
        if request.last_token_s is not None:
            request.model_s += (now_s - request.last_token_s) / max(1, self.num_running)

    def _publish(self) -> None:
        """The running and waiting gauges (vLLM's own metrics carry the rest)."""
        self._metrics.waiting.set(self._num_waiting)
        self._metrics.running.set(self.num_running)


def _entries(position: Mapping[int, Any]) -> dict[int, tuple[float, int]]:
    """vLLM's ``{token id: Logprob}`` as ``{token id: (logprob, rank)}``."""
    return {token_id: (entry.logprob, entry.rank) for token_id, entry in position.items()}


def _vllm_error(exc: Exception) -> ConveyorError:
    """A vLLM failure as Conveyor's error: its validation errors are the caller's (400)."""
    for error in (exc, exc.__cause__):
        names = {kind.__name__ for kind in type(error).__mro__}
        if isinstance(error, ValueError) or "VLLMClientError" in names:
            return InvalidRequest(str(error))
    return ModelFault(f"vLLM failed the request: {exc}")
