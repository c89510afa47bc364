"""The engine thread's first step: a full step of placeholder prompts before any request.

The first step of a shape pays for what later steps reuse: oneDNN generates its matmul
kernels for each new row count (about 17 ms for SmolLM2's four projection shapes at a
thousand rows, on 2 cores), and the engine thread's malloc arena grows, page by page, to
the step's activations (kept afterwards: see ``cli.malloc_tuning``). Run on the engine
thread itself (each thread allocates from its own arena), one step of
``max_num_batched_tokens`` tokens, the shape of every full step under load, moves that cost
from the first busy step to start-up. Its keys and values land in blocks no sequence holds
yet, which are written again before anything reads them. Where the runner pads steps to
row buckets (``WarmsRowBuckets``), every bucket's kernels are generated next (up to the
row count where padding pays, measured first unless configured: see ``row_buckets``).
``LLMEngine.start`` returns once both have run, so the model counts as loaded (and the
server as ready) only then.
"""

from __future__ import annotations

import logging
import time

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.core.step import SeqChunk, StepExecutor, WarmsRowBuckets
from conveyor.engine.cpu_threads import pin_engine_thread
from conveyor.errors import ModelOutOfMemory

__all__ = ["prepare_engine_thread", "warm_up_chunks"]

log = logging.getLogger(__name__)


def warm_up_chunks(
    num_tokens: int, *, max_model_len: int, block_size: int, num_kv_blocks: int, vocab_size: int
) -> tuple[SeqChunk, ...]:
    """Placeholder prompts of at most ``max_model_len`` tokens, ``num_tokens`` in all (fewer
    where the KV cache holds fewer), each on its own blocks counted up from block 0."""
    num_tokens = min(num_tokens, num_kv_blocks * block_size)
    chunks: list[SeqChunk] = []
    next_block = 0
    while num_tokens > 0:
        length = min(num_tokens, max_model_len)
        num_blocks = -(-length // block_size)
        tokens = tuple(position % vocab_size for position in range(length))
        table = tuple(range(next_block, next_block + num_blocks))
        chunks.append(SeqChunk(tokens, 0, table, needs_logits=True))
        next_block += num_blocks
        num_tokens -= length
    return tuple(chunks)


def prepare_engine_thread(config: EngineConfig, runner: StepExecutor) -> None:
    """On the engine thread, before its first request: pin it and set its threads, then run
    ``config.warm_up_chunks`` through ``runner`` (a failure is logged, never raised: the
    engine serves without the warm-up)."""
    pin_engine_thread(config.threads, config.cpu_cores)
    if config.warm_up_chunks:
        started_s = time.perf_counter()
        try:
            runner.execute(config.warm_up_chunks)
        except (ModelOutOfMemory, RuntimeError, ValueError) as error:
            log.warning("engine warm-up step failed, serving without it: %s", error)
            return
        num_tokens = sum(len(chunk.token_ids) for chunk in config.warm_up_chunks)
        log.info("engine warm-up: %d tokens in %.2f s", num_tokens, time.perf_counter() - started_s)
    if config.warm_up_rows and isinstance(runner, WarmsRowBuckets):
        _warm_row_buckets(runner, config.warm_up_rows)


def _warm_row_buckets(runner: WarmsRowBuckets, max_rows: int) -> None:
    """The runner's row buckets up to ``max_rows`` (a failure is logged, never raised)."""
    started_s = time.perf_counter()
    try:
        count = runner.warm_row_buckets(max_rows)
    except (ModelOutOfMemory, RuntimeError, ValueError) as error:
        log.warning("engine row-bucket warm-up failed, serving without it: %s", error)
        return
    if count:
        log.info("engine warm-up: %d row buckets in %.2f s", count, time.perf_counter() - started_s)
