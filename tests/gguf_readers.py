"""One ``gguf.GGUFReader`` per file for everything transformers loads from a GGUF.

transformers parses the file again for the config, the tokenizer and the weights, and the
parse of a 49k-token vocabulary takes seconds; its weight loader also rebuilds ``gguf``'s
(pure) tensor-name map for every module. Within :func:`shared_gguf_readers` each file is
parsed once and the map built once. The readers are only read.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import pytest


@contextmanager
def shared_gguf_readers() -> Iterator[None]:
    """Share readers (and the tensor-name map) among the GGUF loads inside the block."""
    readers: dict[str, Any] = {}
    original = gguf.GGUFReader

    def shared(path: Any, mode: Any = "r") -> Any:
        key = f"{Path(path).resolve()}:{mode}"
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", shared)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield
