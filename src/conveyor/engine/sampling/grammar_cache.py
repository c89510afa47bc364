"""Compiled grammars kept by their text, so each distinct grammar is compiled once.

Compiling a grammar against a model's vocabulary is the costly part of constrained
decoding. A request's grammar is compiled when the request is checked (on a worker
thread, off the event loop); the engine thread, which gives each sequence a matcher of
its own, then takes a copy of the compiled grammar instead of compiling it again while
every sequence's step waits. Batch lines that share a schema share one compile too.

Thread-safe. A compile runs outside the lock (a long one holds up no other grammar); the
least recently used grammar goes once more than ``capacity`` are kept. Standard library
only: the compiler and the copy are given.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["DEFAULT_CAPACITY", "GrammarCache"]

T = TypeVar("T")

# Distinct grammars kept per model: more than the requests a step holds use at once.
DEFAULT_CAPACITY = 64


class GrammarCache(Generic[T]):
    """Compiled grammars by text; ``get`` hands out copies, never the kept original."""

    def __init__(
        self,
        compile_grammar: Callable[[str], T],
        copy: Callable[[T], T],
        *,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        """Compile with ``compile_grammar`` (it raises for a bad grammar: nothing is kept
        then), hand out ``copy`` of what it made; keep at most ``capacity``."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._compile = compile_grammar
        self._copy = copy
        self._capacity = capacity
        self._compiled: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many compiled grammars are kept."""
        return len(self._compiled)

    def __contains__(self, text: object) -> bool:
        """Whether the grammar ``text`` is compiled and kept."""
        return text in self._compiled

    def compile(self, text: str) -> None:
        """Compile ``text`` unless it is kept already (errors raised as the compiler's)."""
        with self._lock:
            if text in self._compiled:
                self._compiled.move_to_end(text)
                return
        self._keep(text, self._compile(text))

    def get(self, text: str) -> T:
        """A fresh copy of the grammar ``text``, compiled first if it is not kept."""
        with self._lock:
            compiled = self._compiled.get(text)
            if compiled is not None:
                self._compiled.move_to_end(text)
                return self._copy(compiled)
        compiled = self._compile(text)
        self._keep(text, compiled)
        with self._lock:
            return self._copy(compiled)

    def _keep(self, text: str, compiled: T) -> None:
        """Keep ``compiled`` as the grammar ``text`` (the first kept wins a race), evicting
        the least recently used beyond the capacity."""
        with self._lock:
            self._compiled.setdefault(text, compiled)
            self._compiled.move_to_end(text)
            while len(self._compiled) > self._capacity:
                self._compiled.popitem(last=False)
