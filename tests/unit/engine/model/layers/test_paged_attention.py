"""In-place paged decode attention: the eager function, warm-up sizes, the cache offset,
and the compiled graph (one compile for the module) serving every shape without a recompile.
The tests that compile are slow (seconds, more on a busy machine: past the unit timeout)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from conveyor.engine.model.layers.attention import decode_attention
from conveyor.engine.model.layers.paged_attention import (
    CACHE_OFFSET_ELEMENTS,
    CompiledDecodeAttention,
    cache_at_offset,
    paged_decode_attention,
    warm_up_sizes,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, NUM_HEADS = 40, 4, 2, 8, 6


def _step(
    rows: int, width: int, seed: int, *, kv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query rows, block tables and an additive mask [rows, 1, 1, width * BLOCK_SIZE]
    hiding keys past each row's (random) position, made in inference mode like a step's."""
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        q = torch.randn(rows, NUM_HEADS, HEAD_DIM, generator=generator, dtype=kv.dtype)
        tables = torch.randint(0, NUM_BLOCKS, (rows, width), generator=generator)
        positions = torch.randint(0, width * BLOCK_SIZE, (rows,), generator=generator)
        visible = torch.arange(width * BLOCK_SIZE)[None, :] <= positions[:, None]
        mask = torch.zeros(visible.shape, dtype=kv.dtype).masked_fill(~visible, -math.inf)
    return q, tables, mask[:, None, None, :]


def _gathered_reference(
    q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], tables: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The eager path: blocks copied out, then ``decode_attention``."""
    rows = tables.shape[0]
    keys = kv[0][tables].reshape(rows, -1, NUM_KV_HEADS, HEAD_DIM)
    values = kv[1][tables].reshape(rows, -1, NUM_KV_HEADS, HEAD_DIM)
    return decode_attention(q.unsqueeze(2), keys, values, mask).squeeze(2)


def _random_cache(layers: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[layers, 2, blocks, block_size, kv_heads, dim] of random values, off offset 0."""
    shape = (layers, 2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    cache = cache_at_offset(shape, dtype, torch.device("cpu"))
    return cache.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(9)))


def test_warm_up_sizes_avoid_every_fixed_size() -> None:
    rows, width = warm_up_sizes({7, 5, 3}, block_size=16)
    assert len({rows, width, width * 16}) == 3
    assert not {rows, width, width * 16} & {7, 5, 3}
    # The first candidate pair when nothing is in the way.
    assert warm_up_sizes(set(), block_size=16) == (7, 5)


def test_warm_up_sizes_refuse_when_no_candidate_is_clear() -> None:
    with pytest.raises(ValueError, match="no warm-up sizes"):
        warm_up_sizes({7, 11, 13, 17, 19}, block_size=16)


def test_cache_at_offset_is_zeroed_and_never_at_offset_zero() -> None:
    cache = cache_at_offset((3, 2, 4), torch.bfloat16, torch.device("cpu"))
    assert cache.shape == (3, 2, 4) and cache.dtype == torch.bfloat16
    assert cache.storage_offset() == CACHE_OFFSET_ELEMENTS
    assert cache.is_contiguous() and not cache.any()


def test_paged_decode_attention_equals_the_gathered_path() -> None:
    kv = _random_cache(1)[0]
    q, tables, mask = _step(5, 3, seed=1, kv=kv)
    with torch.inference_mode():
        out = paged_decode_attention(q, kv[0], kv[1], tables, mask.view(5, 3, BLOCK_SIZE))
        expected = _gathered_reference(q, (kv[0], kv[1]), tables, mask)
    torch.testing.assert_close(out, expected)


@pytest.fixture(scope="module")
def compiled() -> Iterator[CompiledDecodeAttention]:
    """One compiled attention for the module's cache layout (the compile takes seconds)."""
    attention = CompiledDecodeAttention()
    seconds = attention.warm_up(_random_cache(1)[0, 0], num_heads=NUM_HEADS)
    assert seconds > 0
    yield attention


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("rows", "width", "layer"), [(2, 2, 0), (9, 3, 1), (4, 10, 2)])
def test_compiled_serves_every_shape_and_layer_without_recompiling(
    compiled: CompiledDecodeAttention, rows: int, width: int, layer: int
) -> None:
    kv = _random_cache(3)[layer]
    q, tables, mask = _step(rows, width, seed=rows, kv=kv)
    before = compiled.num_fallbacks
    with torch.inference_mode():
        out = compiled(q, kv[0], kv[1], tables, mask)
        expected = _gathered_reference(q, (kv[0], kv[1]), tables, mask)
    assert out is not None and compiled.num_fallbacks == before
    torch.testing.assert_close(out, expected)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_compiled_leaves_single_rows_and_blocks_to_the_eager_path(
    compiled: CompiledDecodeAttention,
) -> None:
    kv = _random_cache(1)[0]
    for rows, width in ((1, 3), (3, 1)):
        q, tables, mask = _step(rows, width, seed=3, kv=kv)
        with torch.inference_mode():
            assert compiled(q, kv[0], kv[1], tables, mask) is None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_call_the_graph_does_not_cover_falls_back_instead_of_compiling(
    compiled: CompiledDecodeAttention,
) -> None:
    # A cache at storage offset 0 (not from cache_at_offset) fails a guard of the graph.
    plain = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    q, tables, mask = _step(3, 2, seed=4, kv=plain)
    before = compiled.num_fallbacks
    with torch.inference_mode():
        assert compiled(q, plain[0], plain[1], tables, mask) is None
    assert compiled.num_fallbacks == before + 1
