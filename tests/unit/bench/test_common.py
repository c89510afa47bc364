"""The bench's shared helpers: what a results file says about the machine."""

from __future__ import annotations

from bench.common import VECTOR_FLAGS, machine_info, openmp_env, vector_flags

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


def test_openmp_env_keeps_only_the_settings_that_are_set() -> None:
    environ = {"GOMP_SPINCOUNT": "100000", "OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}
    assert openmp_env(environ) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"}
    assert openmp_env({}) == {}
    assert "openmp_env" in machine_info()
