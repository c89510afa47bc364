"""Result-cache keys: content addresses of deterministic requests only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson
import pytest

from conveyor.jobs.cache import ResultCache, cache_key, fresh_answer, is_deterministic
from conveyor.jobs.store import AsyncJobStore
from conveyor.stores import open_job_store
from conveyor.stores.sql_store import SqlJobStore


def test_keys_ignore_key_order_and_separate_models_and_endpoints() -> None:
    body = {"model": "m", "input": ["a", "b"], "encoding_format": "float"}
    same = {"encoding_format": "float", "input": ["a", "b"], "model": "m"}
    assert cache_key("t", "/v1/embeddings", body) == cache_key("t", "/v1/embeddings", same)
    assert cache_key("t", "/v1/embeddings", body) != cache_key(
        "t", "/v1/embeddings", {**body, "model": "n"}
    )
    assert cache_key("t", "/v1/embeddings", body) != cache_key(
        "t", "/v1/embeddings", {**body, "input": "ab"}
    )


def test_generation_is_cached_only_when_greedy() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not is_deterministic("/v1/chat/completions", chat)
    assert not is_deterministic("/v1/chat/completions", {**chat, "temperature": 0.7})
    assert is_deterministic("/v1/chat/completions", {**chat, "temperature": 0})
    assert not is_deterministic("/v1/completions", {"temperature": 0, "n": 2})
    assert cache_key("t", "/v1/completions", {"model": "m", "prompt": "x"}) is None
    assert is_deterministic("/v1/embeddings", {"model": "m"})


class CountingStore:
    """A job store that counts its result-cache round trips."""

    def __init__(self, inner: SqlJobStore) -> None:
        self.inner = inner
        self.num_calls = 0

    def cache_get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        self.num_calls += 1
        return self.inner.cache_get_many(keys)

    def cache_put_many(self, entries: Mapping[str, bytes]) -> None:
        self.num_calls += 1
        self.inner.cache_put_many(entries)


@pytest.mark.anyio
async def test_result_cache_round_trip() -> None:
    store = open_job_store("sqlite://:memory:")
    cache = ResultCache(AsyncJobStore(store))
    await cache.put_many([("k1", b"one")])
    await cache.put_many([("k1", b"ignored")])
    assert await cache.get_many(["k1", "k2", None]) == [b"one", None, None]
    store.close()


@pytest.mark.anyio
async def test_result_cache_makes_one_round_trip_per_batch_of_keys() -> None:
    counting = CountingStore(open_job_store("sqlite://:memory:"))
    cache = ResultCache(AsyncJobStore(counting))  # type: ignore[arg-type]
    await cache.put_many([(f"k{i}", b"v") for i in range(5)])
    assert counting.num_calls == 1
    assert await cache.get_many(["k0", None, "k4", "k9", "k0"]) == [b"v", None, b"v", None, b"v"]
    assert counting.num_calls == 2
    assert await cache.get_many([None, None]) == [None, None]  # nothing to look up: no trip
    assert counting.num_calls == 2
    counting.inner.close()


def test_keys_separate_tenants() -> None:
    body = {"model": "m", "input": "same text"}
    assert cache_key("acme", "/v1/embeddings", body) != cache_key("globex", "/v1/embeddings", body)
    greedy = {"model": "m", "prompt": "x", "temperature": 0}
    assert cache_key("acme", "/v1/completions", greedy) != cache_key("b", "/v1/completions", greedy)


def test_a_cached_generation_answer_gets_a_fresh_id_and_timestamp() -> None:
    cached = orjson.dumps({"id": "chatcmpl-old", "object": "chat.completion", "created": 1,
                           "choices": [{"index": 0}]})  # fmt: skip
    answer = orjson.loads(fresh_answer("/v1/chat/completions", cached))
    assert answer["id"].startswith("chatcmpl-") and answer["id"] != "chatcmpl-old"
    assert answer["created"] > 1
    assert answer["choices"] == [{"index": 0}]
    other = orjson.loads(fresh_answer("/v1/chat/completions", cached))
    assert other["id"] != answer["id"]


def test_a_cached_embedding_is_served_as_stored() -> None:
    cached = orjson.dumps({"object": "list", "data": [], "model": "m"})
    assert fresh_answer("/v1/embeddings", cached) == cached
