"""POST /v1/embeddings through the official openai client, on a real server process."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import openai
import pytest

from conveyor.models.synthetic import synthetic_vector
from tests.e2e.conftest import SYNTHETIC, Server

pytestmark = pytest.mark.slow


def client(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=key, max_retries=0)


def test_single_and_many_inputs_with_usage(main_server: Server) -> None:
    c = client(main_server)
    one = c.embeddings.create(model="syn", input="hello there world")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 8
    assert one.usage.prompt_tokens == 3 and one.usage.total_tokens == 3
    many = c.embeddings.create(model="syn", input=["a", "b c", "d e f"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.usage.prompt_tokens == 6
    expected = synthetic_vector("b c", 8)
    assert np.allclose(many.data[1].embedding, expected, atol=1e-6)


def test_float_and_base64_agree(main_server: Server) -> None:
    c = client(main_server)
    as_float = c.embeddings.create(model="syn", input="same text", encoding_format="float")
    as_b64 = c.embeddings.create(model="syn", input="same text", encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(as_b64.data[0].embedding), dtype="<f4")
    assert np.allclose(as_float.data[0].embedding, decoded)
    default = c.embeddings.create(model="syn", input="same text")  # the client asks for base64
    assert np.allclose(default.data[0].embedding, decoded)
    raw = httpx.post(
        f"{main_server.api}/embeddings",
        json={"model": "syn", "input": "same text", "encoding_format": "base64"},
    ).json()
    assert isinstance(raw["data"][0]["embedding"], str)


def test_token_id_inputs(main_server: Server) -> None:
    c = client(main_server)
    one = c.embeddings.create(model="syn", input=[5, 6, 7])
    assert len(one.data) == 1 and one.usage.prompt_tokens == 3
    two = c.embeddings.create(model="syn", input=[[1, 2], [3, 4, 5, 6]])
    assert len(two.data) == 2 and two.usage.prompt_tokens == 6


def test_minilm_matches_sentence_transformers(main_server: Server) -> None:
    from sentence_transformers import SentenceTransformer

    from conveyor.models.embedding import bundled_model_path

    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Batching is what makes a GPU pay for itself.",
        "short",
        "A somewhat longer sentence that talks about inference servers, queues and latency.",
    ]
    served = client(main_server).embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    reference = SentenceTransformer(str(bundled_model_path()), device="cpu").encode(texts)
    for got, want in zip(served.data, reference, strict=True):
        vec = np.asarray(got.embedding)
        cosine = float(vec @ want / (np.linalg.norm(vec) * np.linalg.norm(want)))
        assert cosine > 0.999
    assert served.usage.prompt_tokens == sum(
        len(ids)
        for ids in SentenceTransformer(str(bundled_model_path())).tokenizer(texts)["input_ids"]
    )


def test_minilm_too_long_is_400_unless_truncated(main_server: Server) -> None:
    long_text = "word " * 400
    c = client(main_server)
    with pytest.raises(openai.BadRequestError) as info:
        c.embeddings.create(model="all-MiniLM-L6-v2", input=long_text)
    assert "256" in info.value.message
    ok = c.embeddings.create(
        model="all-MiniLM-L6-v2", input=long_text, extra_body={"truncate": True}
    )
    assert ok.usage.prompt_tokens == 256


def test_concurrent_callers_are_batched_and_each_gets_its_own_result(main_server: Server) -> None:
    before = main_server.metric("conveyor_batches_total", model="syn", reason="full")
    before += main_server.metric("conveyor_batches_total", model="syn", reason="wait")
    texts = [f"caller {i}" for i in range(64)]

    def call(text: str) -> list[float]:
        return client(main_server).embeddings.create(model="syn", input=text).data[0].embedding

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, texts))
    for text, vector in zip(texts, results, strict=True):
        assert np.allclose(vector, synthetic_vector(text, 8), atol=1e-6)
    after = main_server.metric("conveyor_batches_total", model="syn", reason="full")
    after += main_server.metric("conveyor_batches_total", model="syn", reason="wait")
    assert after - before < 64  # some callers shared a batch


def test_poisoned_input_fails_alone(main_server: Server) -> None:
    response = httpx.post(
        f"{main_server.api}/embeddings",
        json={"model": "syn", "input": ["fine", "has POISON in it", "also fine"]},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "input_rejected"
    ok = client(main_server).embeddings.create(model="syn", input=["fine", "also fine"])
    assert len(ok.data) == 2


def test_oom_batches_are_halved_and_everyone_is_answered(main_server: Server) -> None:
    texts = [f"t{i}" for i in range(SYNTHETIC["oom_above"] * 2)]
    result = client(main_server).embeddings.create(model="syn", input=texts)
    assert len(result.data) == len(texts)
    assert main_server.metric("conveyor_oom_backoffs_total", model="syn") >= 1


def test_models_health_ready_metrics(main_server: Server) -> None:
    ids = {m.id for m in client(main_server).models.list()}
    assert ids == {"syn", "all-MiniLM-L6-v2"}
    assert httpx.get(f"{main_server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{main_server.url}/ready").status_code == 200
    text = httpx.get(f"{main_server.url}/metrics").text
    for name in (
        "conveyor_queue_depth",
        "conveyor_in_flight",
        "conveyor_batch_size_inputs",
        "conveyor_batch_size_tokens",
        "conveyor_batch_fill_ratio",
        "conveyor_batches_total",
        "conveyor_queue_wait_seconds",
        "conveyor_model_seconds",
        "conveyor_request_latency_seconds",
        "conveyor_requests_total",
        "conveyor_oom_backoffs_total",
    ):
        assert name in text
