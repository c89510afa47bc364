"""The C library through ctypes: found once, with the calls the host and the KV cache use."""

from __future__ import annotations

import sys

import pytest

from conveyor.c_library import c_library


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's calls")
def test_the_c_library_is_loaded_once_with_the_calls_conveyor_makes() -> None:
    library = c_library()
    assert library is not None
    assert c_library() is library
    assert callable(library.madvise) and callable(library.malloc_trim)
