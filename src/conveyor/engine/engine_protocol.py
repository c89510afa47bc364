"""What a hosted generative model needs of its engine: Conveyor's own or vLLM's.

``HostedGenerator`` (and through it every endpoint, batch lines and the dashboard) talks
to its engine only through this protocol, so ``engine: vllm`` serves exactly what
``engine: conveyor`` serves. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from conveyor.priority import Priority

if TYPE_CHECKING:
    from conveyor.engine.core.engine_config import EngineConfig
    from conveyor.engine.core.prefix_digest import PrefixDigest
    from conveyor.engine.model.lora.registry import AdapterEntry
    from conveyor.engine.request import GenerationRequest
    from conveyor.engine.sampling.grammar import GrammarCompiler
    from conveyor.engine.sampling.params import SamplingParams
    from conveyor.engine.stream import GenerationStream

__all__ = ["AdapterSync", "GenerationEngine"]


class GenerationEngine(Protocol):
    """A continuous-batching engine for one model, fed by requests, read through streams.

    ``new_request`` and ``add_request`` are called on the event loop; outputs reach the
    stream on its loop. ``stop`` blocks: call it off the loop.
    """

    config: EngineConfig
    grammars: GrammarCompiler
    prefix_digest: PrefixDigest

    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet running."""
        ...

    @property
    def num_running(self) -> int:
        """Sequences running (the heartbeat's load counts them with the waiting ones)."""
        ...

    @property
    def num_batch(self) -> int:
        """Batch-job sequences among the waiting and running ones (the router's load
        leaves them out: online requests go before them)."""
        ...

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the KV-cache pool."""
        ...

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
        ...

    def add_request(self, request: GenerationRequest, stream: GenerationStream) -> None:
        """Queue ``request``; its outputs go to ``stream``. 503 once the engine stops."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request and free what it holds; unknown ids are ignored."""
        ...

    def estimated_drain_s(self) -> float:
        """Rough seconds until the requests waiting now have all been admitted."""
        ...

    def predicted_online_wait_s(self, num_new: int) -> float | None:
        """Seconds until the last of ``num_new`` online arrivals gets a seat (None: unknown)."""
        ...

    def stop(self) -> None:
        """Stop generating; every unfinished request gets 503 (blocking)."""
        ...


class AdapterSync(Protocol):
    """An engine that keeps its own table of LoRA adapters (vLLM's), told of run-time changes.

    Conveyor's ``LoraRegistry`` stays the one list of names: these follow its loads and
    unloads, on the event loop.
    """

    async def add_adapter(self, entry: AdapterEntry) -> None:
        """Take in a registered adapter; 400 (``AdapterError``) if the engine cannot serve it."""
        ...

    async def remove_adapter(self, entry: AdapterEntry) -> None:
        """Forget an unregistered adapter."""
        ...
