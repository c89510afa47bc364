"""The native decode attention against a float64 reference, compiled and not; its build;
the one-time check that turns the prefill attention on."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import torch

from conveyor.engine.model.layers.native_build import CACHE_ENV, compile_command
from conveyor.engine.model.layers.native_kernels import (
    NATIVE_DIR,
    PREFILL_DTYPES,
    NativeDecodeAttention,
    _load_once,
    native_library,
    prefill_attention_runs,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

BLOCK_SIZE = 4
NUM_BLOCKS = 40
HEAD_DIM = 40  # not a multiple of the vector width: the general loops and their tails
# Whole vectors of 16 lanes (2, 4 and 8 of them): the path that keeps a head in registers.
VECTOR_DIMS = (32, 64, 128)


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    assert native_library() is not None, "the suite's machine builds the kernels (g++)"


def _case(
    rows: int,
    heads: int,
    kv_heads: int,
    width: int,
    dtype: torch.dtype,
    seed: int = 0,
    dim: int = HEAD_DIM,
    block_size: int = BLOCK_SIZE,
) -> tuple[torch.Tensor, ...]:
    """q [rows, heads, dim] (a strided view), caches sharing one storage, distinct random
    blocks per row, and a mask hiding a window at the start and padding at the end."""
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, NUM_BLOCKS, block_size, kv_heads, dim, generator=gen).to(dtype)
    wide = torch.randn(rows, heads, dim + 8, generator=gen).to(dtype)
    q = wide[:, :, 4 : 4 + dim]  # not contiguous, as a slice of the projections is
    tables = torch.stack([torch.randperm(NUM_BLOCKS, generator=gen)[:width] for _ in range(rows)])
    length = width * block_size
    ends = torch.randint(1, length + 1, (rows,), generator=gen)
    starts = (ends - torch.randint(1, length + 1, (rows,), generator=gen)).clamp_min(0)
    pos = torch.arange(length)
    visible = (pos[None, :] >= starts[:, None]) & (pos[None, :] < ends[:, None])
    mask = torch.zeros(rows, length).masked_fill(~visible, float("-inf")).to(dtype)
    return q, kv[0], kv[1], tables, mask.view(rows, width, block_size)


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The same attention in float64 over gathered copies."""
    rows, heads, dim = q.shape
    kv_heads = k.shape[2]
    keys = k[tables].double().flatten(1, 2).transpose(1, 2)  # [rows, kv_heads, len, dim]
    values = v[tables].double().flatten(1, 2).transpose(1, 2)
    queries = q.double().view(rows, kv_heads, heads // kv_heads, dim) * dim**-0.5
    scores = queries @ keys.mT + mask.double().view(rows, 1, 1, -1)
    return (scores.softmax(-1) @ values).view(rows, heads, dim)


@pytest.mark.parametrize("dim", [HEAD_DIM, *VECTOR_DIMS])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (4, 4), (9, 3), (18, 2)])
def test_it_matches_the_float64_reference(
    dtype: torch.dtype, tolerance: float, heads: int, kv_heads: int, dim: int
) -> None:
    # (18, 2): groups of 9 query heads, more than the register path takes.
    q, k, v, tables, mask = _case(
        rows=5, heads=heads, kv_heads=kv_heads, width=7, dtype=dtype, dim=dim
    )
    got = NativeDecodeAttention()(q, k, v, tables, mask)
    assert got.dtype == dtype and got.shape == q.shape and got.is_contiguous()
    torch.testing.assert_close(got.double(), _reference(q, k, v, tables, mask),
                               rtol=tolerance, atol=tolerance)  # fmt: skip


@pytest.mark.parametrize("block_size", [BLOCK_SIZE, 16])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("group", range(1, 9))
def test_every_group_size_of_the_register_path_matches_the_reference(
    group: int, dtype: torch.dtype, tolerance: float, dim: int, block_size: int
) -> None:
    # The values pass is compiled once per group size (1 to 8 query heads a KV head), and
    # sums a head's vectors in chunks where the group's sums would not fit the registers
    # whole (8 heads of 128 dims: four chunks of two vectors on AVX-512).
    q, k, v, tables, mask = _case(
        rows=5, heads=2 * group, kv_heads=2, width=6, dtype=dtype, dim=dim,
        block_size=block_size, seed=group,
    )  # fmt: skip
    got = NativeDecodeAttention()(q, k, v, tables, mask)
    torch.testing.assert_close(got.double(), _reference(q, k, v, tables, mask),
                               rtol=tolerance, atol=tolerance)  # fmt: skip


@pytest.mark.parametrize("dim", [HEAD_DIM, 64])
def test_it_reads_the_caches_through_their_strides(dim: int) -> None:
    # K and V as the runner hands them: two views of one [2, ...] allocation per layer.
    q, k, v, tables, mask = _case(
        rows=3, heads=6, kv_heads=2, width=5, dtype=torch.float32, dim=dim
    )
    both = torch.stack([k, v]).transpose(1, 2).contiguous().transpose(1, 2)  # slot-major
    assert not both[0].is_contiguous()
    got = NativeDecodeAttention()(q, both[0], both[1], tables, mask)
    torch.testing.assert_close(
        got.double(), _reference(q, k, v, tables, mask), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dim", [HEAD_DIM, 64])
def test_a_row_with_nothing_visible_attends_to_nothing(dim: int) -> None:
    q, k, v, tables, mask = _case(
        rows=2, heads=4, kv_heads=2, width=3, dtype=torch.float32, dim=dim
    )
    mask[1] = float("-inf")
    got = NativeDecodeAttention()(q, k, v, tables, mask)
    assert torch.equal(got[1], torch.zeros_like(got[1]))  # zeros, not NaN
    want = _reference(q, k, v, tables, mask)[0]
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dim", [32, 64, 128])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (8, 8)])
@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)],
)
def test_blocks_of_sixteen_slots_match_the_reference(
    block_size: int, dim: int, heads: int, kv_heads: int, dtype: torch.dtype, tolerance: float
) -> None:
    # The paths that score sixteen keys in one vector (AVX-512; in bfloat16 by AVX512-BF16
    # where the CPU has it): the masks hide whole groups of sixteen slots, parts of one,
    # and windows' starts; the caches are slot-major views of one allocation, as the
    # runner's are.
    q, k, v, tables, mask = _case(
        rows=9, heads=heads, kv_heads=kv_heads, width=5, dtype=dtype, dim=dim,
        block_size=block_size, seed=4,
    )  # fmt: skip
    both = torch.stack([k, v]).transpose(1, 2).contiguous().transpose(1, 2)
    mask[0] = float("-inf")
    got = NativeDecodeAttention()(q, both[0], both[1], tables, mask)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    torch.testing.assert_close(
        got[1:].double(), _reference(q, k, v, tables, mask)[1:], rtol=tolerance, atol=tolerance
    )


def test_bad_shapes_are_refused() -> None:
    q, k, v, tables, mask = _case(rows=2, heads=4, kv_heads=2, width=3, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="one block table per row"):
        NativeDecodeAttention()(q, k, v, tables[:1], mask[:1])
    with pytest.raises(RuntimeError, match="share a dtype"):
        NativeDecodeAttention()(q.double(), k, v, tables, mask)


@pytest.mark.slow  # compiles (seconds)
@pytest.mark.timeout(240)
def test_the_op_runs_inside_a_compiled_graph_unbroken() -> None:
    q, k, v, tables, mask = _case(rows=5, heads=6, kv_heads=2, width=7, dtype=torch.float32)

    def attend(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.conveyor_native.decode_attention(
            q * 1.0, k, v, tables, mask, HEAD_DIM**-0.5
        )
        return out + 1.0

    compiled = torch.compile(attend, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(q, mask), attend(q, mask))


@pytest.mark.slow  # the compiler reads torch's headers: seconds a source
@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["decode_attention.cpp", "prefill_attention.cpp"])
def test_a_kernel_compiles_for_torchs_avx2_vectors_on_an_avx512_cpu(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU: torch's vectors are AVX2's while the
    compiler may use AVX-512. The prefill kernel's AVX-512 code, mixing its own vectors with
    torch's, did not compile there, and every kernel was left off. Checked for a Sapphire
    Rapids target (AVX-512, AVX512-BF16, AMX) on any host: the compiler needs no such CPU."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    command = compile_command(NATIVE_DIR / source, tmp_path / "out.o")
    assert "-DCPU_CAPABILITY_AVX2" in command
    command = ["-march=sapphirerapids" if part == "-march=native" else part for part in command]
    done = subprocess.run(
        [*command, "-fsyntax-only"], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_failed_build_leaves_the_kernels_off_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    compiler = tmp_path / "broken-cxx"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && echo broken 1.0 && exit 0\n'
                        "echo 'fatal: no headers' >&2\nexit 1\n")  # fmt: skip
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kernels"))
    with caplog.at_level(logging.WARNING):
        assert _load_once.__wrapped__() is None  # the uncached call: a build is tried
    assert "no headers" in caplog.text
    assert not any(path.suffix == ".so" for path in (tmp_path / "kernels").rglob("*"))


def test_models_loading_at_once_load_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two loads at once would load the library twice, and the second's fake registration
    # would fail, leaving that model without the kernel: native_library serialises them.
    import concurrent.futures
    import threading
    import time

    from conveyor.engine.model.layers import native_kernels

    inside, most = [0], [0]
    lock = threading.Lock()

    def slow_load() -> Path:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with lock:
            inside[0] -= 1
        return Path("kernels.so")

    monkeypatch.setattr(native_kernels, "_load_once", slow_load)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: native_library(), range(8)))
    assert paths == [Path("kernels.so")] * 8 and most[0] == 1


def _without_cache(monkeypatch: pytest.MonkeyPatch, kernel: object) -> bool:
    """``prefill_attention_runs``'s answer, uncached, with ``kernel`` as the op."""
    monkeypatch.setattr(torch.ops.conveyor_native, "has_prefill_attention", lambda dtype: True)
    monkeypatch.setattr(torch.ops.conveyor_native, "prefill_attention", kernel)
    answer: bool = prefill_attention_runs.__wrapped__()  # type: ignore[attr-defined]
    return answer


def test_a_prefill_kernel_that_answers_wrong_is_left_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def zeros(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *_: object
    ) -> None:
        out.zero_()

    with caplog.at_level(logging.WARNING):
        assert not _without_cache(monkeypatch, zeros)
    assert "off by" in caplog.text


def test_a_prefill_kernel_that_refuses_this_cpu_is_left_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuses(*_: object) -> None:
        raise RuntimeError("brgemm: packed bfloat16 is not supported here")

    with caplog.at_level(logging.WARNING):
        assert not _without_cache(monkeypatch, refuses)
    assert "not supported here" in caplog.text


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_the_prefill_kernel_is_used_wherever_it_is_built(dtype: torch.dtype) -> None:
    # bfloat16 on a CPU with AVX512-BF16 (AMX or not), float32 on one with AVX-512: the
    # check passes; elsewhere nothing is built for the dtype.
    built = bool(torch.ops.conveyor_native.has_prefill_attention(dtype))
    assert prefill_attention_runs(dtype) == built
