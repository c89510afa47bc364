"""``engine: vllm``: vLLM's ``AsyncLLM`` in-process, behind Conveyor's engine protocol.

Each request is one task on the event loop that iterates vLLM's ``generate``. vLLM
samples (priority scheduling: online before batch); Conveyor's ``GenerationRequest``
turns the tokens into text, finds stop strings and builds the same outputs as its own
engine, so every endpoint reads either engine alike. Closing a stream (a client gone, a
deadline, a stop string) cancels the task, which aborts the request inside vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.engine_metrics import record_finish
from conveyor.engine.outputs import FinishReason, GenerationOutput, TokenLogprobs
from conveyor.engine.request import GenerationRequest
from conveyor.engine.sampling.grammar import GrammarCompiler
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream, deliver_threadsafe
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.vllm_mapping import (
    finish_reason,
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
    vLLM's ``SamplingParams`` from :func:`sampling_kwargs`' dictionary.
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
        self._is_stopped = False

    @property
    def num_waiting(self) -> int:
        """Requests given to vLLM that have no output yet (queued or in prefill)."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Requests that have had their first output and are not finished."""
        return len(self._tasks) - self._num_waiting

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
        """Build a request; ValueError if it cannot run (too long, empty)."""
        if adapter_id:
            raise ValueError("LoRA adapters are not served on engine: vllm yet")
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

    # -- the request's task, on the loop ------------------------------------------------

    async def _run(self, request: GenerationRequest, params: Any, stream: GenerationStream) -> None:
        """Generate, hand each output to the stream, count the ending."""
        is_waiting = True
        try:
            prompt = {"prompt_token_ids": request.prompt_token_ids}
            outputs = self._llm.generate(
                prompt, params, request.request_id, priority=vllm_priority(request.priority)
            )
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
