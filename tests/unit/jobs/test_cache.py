"""Result-cache keys: content addresses of deterministic requests only."""

from __future__ import annotations

from conveyor.jobs.cache import ResultCache, cache_key, is_deterministic
from conveyor.stores.job_store import open_job_store


def test_keys_ignore_key_order_and_separate_models_and_endpoints() -> None:
    body = {"model": "m", "input": ["a", "b"], "encoding_format": "float"}
    same = {"encoding_format": "float", "input": ["a", "b"], "model": "m"}
    assert cache_key("/v1/embeddings", body) == cache_key("/v1/embeddings", same)
    assert cache_key("/v1/embeddings", body) != cache_key("/v1/embeddings", {**body, "model": "n"})
    assert cache_key("/v1/embeddings", body) != cache_key("/v1/embeddings", {**body, "input": "ab"})


def test_generation_is_cached_only_when_greedy() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not is_deterministic("/v1/chat/completions", chat)
    assert not is_deterministic("/v1/chat/completions", {**chat, "temperature": 0.7})
    assert is_deterministic("/v1/chat/completions", {**chat, "temperature": 0})
    assert not is_deterministic("/v1/completions", {"temperature": 0, "n": 2})
    assert cache_key("/v1/completions", {"model": "m", "prompt": "x"}) is None
    assert is_deterministic("/v1/embeddings", {"model": "m"})


def test_result_cache_round_trip() -> None:
    store = open_job_store("sqlite://:memory:")
    cache = ResultCache(store)
    cache.put_many([("k1", b"one")])
    cache.put_many([("k1", b"ignored")])
    assert cache.get_many(["k1", "k2", None]) == [b"one", None, None]
    store.close()
