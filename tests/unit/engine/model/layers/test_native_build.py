"""The native kernels' build: one compiler process per source, run side by side, then a
link; the cache's place and the library's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.model.layers.native_build import (
    CACHE_ENV,
    build_library,
    kernel_cache_dir,
    library_path,
)

# A stand-in compiler: it logs its arguments and writes its ``-o`` file. A compile (``-c``)
# first waits, up to 20 s, until a second compile of the same build has started, so a build
# that compiles its sources one at a time fails here.
FAKE_COMPILER = """#!/bin/sh
[ "$1" = --version ] && echo fake-cxx 1.0 && exit 0
echo "$*" >> "$FAKE_CXX_LOG"
out=""; prev=""
for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done
case " $* " in *" -c "*) touch "$out.started";; esac
case "$*" in *"${FAKE_CXX_FAIL:-no such file}"*) echo "error: no $FAKE_CXX_FAIL" >&2; exit 1;; esac
case " $* " in *" -c "*)
    waited=0
    while [ "$(ls "$(dirname "$out")"/*.started | wc -l)" -lt 2 ]; do
        sleep 0.05; waited=$((waited + 1)); [ "$waited" -gt 400 ] && echo alone >&2 && exit 1
    done;;
esac
echo built > "$out"
"""


@pytest.fixture
def fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$CXX`` set to the stand-in compiler; returns the file it logs its calls to."""
    compiler = tmp_path / "fake-cxx"
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("FAKE_CXX_LOG", str(calls))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kernels"))
    return calls


def _sources(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"// {name}\n")
    return [folder / name for name in names]


def test_each_source_is_compiled_at_once_then_all_are_linked(
    tmp_path: Path, fake_compiler: Path
) -> None:
    sources = _sources(tmp_path / "src", "a.cpp", "b.cpp", "c.cpp")
    target = tmp_path / "kernels" / "lib.so"
    build_library(sources, target, jobs=2)
    assert target.read_text() == "built\n"
    calls = fake_compiler.read_text().splitlines()
    compiles = [call for call in calls if " -c " in call]
    assert sorted(call.split(" -c ")[1].split()[0] for call in compiles) == [
        str(source) for source in sources
    ]
    assert "-march=native" in compiles[0]
    link = calls[-1]
    assert "-shared" in link and " -c " not in link
    objects = [Path(part).name for part in link.split() if part.endswith(".o")]
    assert objects == [f"{index}-{source.stem}.o" for index, source in enumerate(sources)]
    assert list(target.parent.iterdir()) == [target]  # the objects went with the work folder


def test_a_failed_compile_raises_with_the_compilers_words_and_leaves_no_library(
    tmp_path: Path, fake_compiler: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CXX_FAIL", "b.cpp")
    target = tmp_path / "kernels" / "lib.so"
    with pytest.raises(RuntimeError, match=r"no b\.cpp"):
        build_library(_sources(tmp_path / "src", "a.cpp", "b.cpp"), target, jobs=2)
    assert not target.exists()
    assert "-shared" not in fake_compiler.read_text()  # nothing was linked


def test_the_librarys_name_follows_its_sources_not_the_folder_they_are_in(
    tmp_path: Path, fake_compiler: Path
) -> None:
    here = library_path(_sources(tmp_path / "one", "a.cpp", "b.cpp"))
    elsewhere = library_path(_sources(tmp_path / "two", "a.cpp", "b.cpp"))
    assert here == elsewhere
    assert here.parent == tmp_path / "kernels"
    (tmp_path / "two" / "b.cpp").write_text("// changed\n")
    assert library_path([tmp_path / "two" / "a.cpp", tmp_path / "two" / "b.cpp"]) != here


def test_the_cache_lives_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kernels"))
    assert kernel_cache_dir() == tmp_path / "kernels"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache_dir() == tmp_path / "xdg" / "conveyor" / "kernels"
