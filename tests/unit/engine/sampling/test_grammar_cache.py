"""Compiled grammars by text: one compile per distinct grammar, copies handed out, the
least recently used evicted, a failed compile kept nowhere."""

from __future__ import annotations

import threading

import pytest

from conveyor.engine.sampling.grammar_cache import GrammarCache


class CountingCompiler:
    """A fake compiler: a grammar compiles to a list holding its text; counts compiles."""

    def __init__(self) -> None:
        self.compiled: list[str] = []

    def __call__(self, text: str) -> list[str]:
        if text == "bad":
            raise ValueError("the grammar is invalid")
        self.compiled.append(text)
        return [text]


def copy(compiled: list[str]) -> list[str]:
    return list(compiled)


def test_each_distinct_grammar_compiles_once_however_often_it_is_used() -> None:
    compiler = CountingCompiler()
    cache = GrammarCache(compiler, copy)
    cache.compile("a")  # the request side checks it...
    matchers = [cache.get("a") for _ in range(5)]  # ...each sequence takes a copy
    cache.compile("a")
    cache.get("b")
    cache.get("b")
    assert compiler.compiled == ["a", "b"]
    assert all(m == ["a"] for m in matchers)


def test_copies_are_independent_of_the_kept_grammar() -> None:
    cache = GrammarCache(CountingCompiler(), copy)
    first = cache.get("a")
    first.append("advanced")  # a matcher advances as its sequence generates
    assert cache.get("a") == ["a"]


def test_the_least_recently_used_grammar_is_evicted_beyond_the_capacity() -> None:
    compiler = CountingCompiler()
    cache = GrammarCache(compiler, copy, capacity=2)
    cache.get("a")
    cache.get("b")
    cache.get("a")  # a is now the most recently used
    cache.get("c")  # evicts b
    assert "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2
    cache.get("b")
    assert compiler.compiled == ["a", "b", "c", "b"]


def test_a_grammar_that_does_not_compile_raises_each_time_and_is_not_kept() -> None:
    compiler = CountingCompiler()
    cache = GrammarCache(compiler, copy)
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid"):
            cache.get("bad")
        with pytest.raises(ValueError, match="invalid"):
            cache.compile("bad")
    assert "bad" not in cache and len(cache) == 0


def test_threads_share_one_compiled_grammar() -> None:
    compiler = CountingCompiler()
    cache = GrammarCache(compiler, copy)
    cache.compile("a")
    got: list[list[str]] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("a"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert compiler.compiled == ["a"] and got == [["a"]] * 8


def test_the_capacity_must_hold_a_grammar() -> None:
    with pytest.raises(ValueError, match="capacity"):
        GrammarCache(CountingCompiler(), copy, capacity=0)
