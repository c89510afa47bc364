"""Compiling Conveyor's native CPU kernels into a cached shared library.

Each source is compiled to an object file by its own compiler process, as many at once as
the process may use CPUs, and the objects are then linked (``g++`` or ``$CXX``, ``-O3
-march=native``, torch's headers). Most of a source's time is spent in torch's headers, so
on two cores the four sources take about half the time of one compiler call for them all.

The library is named after everything that shapes it (the sources, torch's version, the
compiler and its flags) and kept in ``$CONVEYOR_KERNEL_CACHE`` (default
``~/.cache/conveyor/kernels``): a changed source or a new torch builds a new one, and an
unchanged one is built once per machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

__all__ = [
    "CACHE_ENV",
    "build_library",
    "compile_command",
    "kernel_cache_dir",
    "library_path",
    "link_command",
]

log = logging.getLogger(__name__)

CACHE_ENV = "CONVEYOR_KERNEL_CACHE"
# The longest one compiler process may take (a source of these kernels takes well under one).
COMPILE_TIMEOUT_S = 600

# torch's vectorised types (at::vec) pick their width from these defines, as inductor's do.
_CAPABILITY_DEFINES = {
    "AVX512": ["-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"],
}


def kernel_cache_dir() -> Path:
    """Where built libraries are kept (``$CONVEYOR_KERNEL_CACHE`` or the user's cache)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conveyor" / "kernels"


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def compile_command(source: Path, target: Path) -> list[str]:
    """The compiler call that compiles one ``source`` into the object file ``target``."""
    torch_dir = Path(torch.__file__).parent
    capability = torch.backends.cpu.get_cpu_capability()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        _compiler(),
        "-O3",
        "-march=native",
        "-std=c++20",
        "-fPIC",
        "-fopenmp",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *_CAPABILITY_DEFINES.get(capability, []),
        f"-I{torch_dir / 'include'}",
        f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
        "-c",
        str(source),
        "-o",
        str(target),
    ]


def link_command(objects: Sequence[Path], target: Path) -> list[str]:
    """The compiler call that links ``objects`` into the shared library ``target``."""
    torch_lib = Path(torch.__file__).parent / "lib"
    return [
        _compiler(),
        "-shared",
        "-fopenmp",
        *map(str, objects),
        f"-L{torch_lib}",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-o",
        str(target),
    ]


def library_path(sources: Sequence[Path]) -> Path:
    """The cached library's path: named after everything that shapes the build."""
    commands = [compile_command(Path(source.name), Path("out.o")) for source in sources]
    commands.append(link_command([Path("out.o")], Path("out.so")))
    version = subprocess.run(
        [_compiler(), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()[:1]
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    for part in (torch.__version__, repr(commands), str(version), sys.platform):
        digest.update(part.encode())
    return kernel_cache_dir() / f"conveyor_native-{digest.hexdigest()[:20]}.so"


def _build_jobs() -> int:
    """How many compiler processes to run at once: the CPUs this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def build_library(sources: Sequence[Path], target: Path, jobs: int | None = None) -> None:
    """Compile ``sources`` (``jobs`` at once) and link them into ``target``, building under a
    private name beside it and renaming it into place: processes building at once each write
    their own file, and either one wins. A failed compile or link raises ``RuntimeError``
    with the compiler's last words."""
    target.parent.mkdir(parents=True, exist_ok=True)
    started_s = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        objects = [Path(work) / f"{index}-{source.stem}.o" for index, source in enumerate(sources)]
        calls = [compile_command(s, o) for s, o in zip(sources, objects, strict=True)]
        with ThreadPoolExecutor(max_workers=jobs or _build_jobs()) as pool:
            for done in list(pool.map(_run, calls)):
                _check(done)
        built = Path(work) / target.name
        _check(_run(link_command(objects, built)))
        os.replace(built, target)
    log.info("built %s in %.1f s", target.name, time.perf_counter() - started_s)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=COMPILE_TIMEOUT_S
    )


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"the compiler failed: {done.stderr[-2000:]}")
