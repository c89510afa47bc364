"""The bench's shared helpers: what a results file says about the machine."""

from __future__ import annotations

from bench.common import VECTOR_FLAGS, machine_info, vector_flags

CPUINFO = """processor\t: 0
model name\t: Some CPU
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_tile
processor\t: 1
flags\t\t: fpu
"""


def test_vector_flags_are_the_first_cpus_in_a_fixed_order() -> None:
    assert vector_flags(CPUINFO) == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]


def test_no_flags_line_gives_none_found() -> None:
    assert vector_flags("processor\t: 0\n") == []


def test_machine_info_names_the_vector_flags() -> None:
    info = machine_info()
    assert isinstance(info["cpu_vector_flags"], list)
    assert set(info["cpu_vector_flags"]) <= set(VECTOR_FLAGS)
