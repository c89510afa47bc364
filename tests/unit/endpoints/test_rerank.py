"""The rerank kind: a tiny random cross-encoder built here, scored over ``/v1/rerank`` and
``/v1/score`` exactly as sentence-transformers' ``CrossEncoder`` scores it; batch lines too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import execute
from conveyor.fakes.checkpoints import build_tiny_cross_encoder
from conveyor.host.service import Service
from conveyor.openai_paths import RERANK
from conveyor.priority import Priority

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "the cat sat on the mat",
             "the quick brown fox jumps over the lazy dog", "which river"]  # fmt: skip


@pytest.fixture(scope="module")
def ranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("ce"))


@pytest.fixture(scope="module")
def reference(ranker_path: Path) -> list[float]:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(ranker_path), device="cpu", local_files_only=True)
    return [float(s) for s in model.predict([(QUERY, doc) for doc in DOCUMENTS])]


@pytest.fixture
async def service(ranker_path: Path, tmp_path: Path) -> AsyncIterator[Service]:
    ranker = {"name": "ranker", "kind": "rerank", "path": str(ranker_path), "device": "cpu",
              "max_batch_size": 3, "max_wait_ms": 1}  # fmt: skip
    syn = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0}
    config = ServerConfig.model_validate({"data_dir": str(tmp_path), "models": [ranker, syn]})
    async with Service(config) as running:
        yield running


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(service.config, service=service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http


async def test_rerank_orders_documents_by_the_cross_encoders_score(
    client: httpx.AsyncClient, reference: list[float]
) -> None:
    body = {"model": "ranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    answer = (await client.post("/v1/rerank", json=body)).json()
    want = sorted(range(len(DOCUMENTS)), key=lambda i: -reference[i])[:3]
    assert [r["index"] for r in answer["results"]] == want
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(reference[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    assert answer["usage"]["total_tokens"] > 0
    bare = {"model": "ranker", "query": QUERY, "documents": [{"text": DOCUMENTS[0]}],
            "return_documents": False}  # fmt: skip
    (only,) = (await client.post("/v1/rerank", json=bare)).json()["results"]
    assert set(only) == {"index", "relevance_score"}


async def test_score_pairs_one_against_many_and_zipped(
    client: httpx.AsyncClient, reference: list[float]
) -> None:
    one_to_many = {"model": "ranker", "text_1": QUERY, "text_2": DOCUMENTS}
    data = (await client.post("/v1/score", json=one_to_many)).json()["data"]
    assert [d["index"] for d in data] == list(range(len(DOCUMENTS)))
    assert np.allclose([d["score"] for d in data], reference, atol=1e-5)
    zipped = {"model": "ranker", "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[:2]}
    pair_scores = [d["score"] for d in (await client.post("/v1/score", json=zipped)).json()["data"]]
    assert np.allclose(pair_scores, reference[:2], atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/rerank", {"model": "syn", "query": "q", "documents": ["d"]}, 400, "not a rerank"),
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}, 404, "nope"),
        ("/v1/rerank", {"model": "ranker", "query": "q", "documents": []}, 400, "documents"),
        ("/v1/score", {"model": "ranker", "text_1": ["a", "b"], "text_2": ["c"]}, 400, "same"),
        ("/v1/embeddings", {"model": "ranker", "input": "a"}, 400, "/v1/rerank"),
        (
            "/v1/rerank",
            {"model": "ranker", "query": "q " * 200, "documents": ["d"]},
            400,
            "truncate",
        ),
    ],
)
async def test_bad_rerank_bodies(
    client: httpx.AsyncClient, path: str, body: dict[str, object], status: int, fragment: str
) -> None:
    answer = await client.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert fragment in answer.json()["error"]["message"]


async def test_a_pair_over_max_input_bytes_is_refused_or_cut_before_tokenizing(
    client: httpx.AsyncClient,
) -> None:
    """The tiny cross-encoder takes 128 tokens, so 4096 bytes a pair by default."""
    huge = {"model": "ranker", "query": QUERY, "documents": ["paris " * 700]}
    refused = await client.post("/v1/rerank", json=huge)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "max_input_bytes" in error["message"] and error["param"] == "documents"
    cut = await client.post("/v1/rerank", json={**huge, "truncate": True})
    # Both are cut to the same 128 tokens: cutting bytes first changed nothing.
    short = {**huge, "documents": ["paris " * 200], "truncate": True}
    expected = (await client.post("/v1/rerank", json=short)).json()["results"]
    assert cut.json()["results"][0]["relevance_score"] == expected[0]["relevance_score"]


async def test_pairs_are_batched_together_and_batch_lines_may_rerank(
    service: Service, reference: list[float]
) -> None:
    body = {"model": "ranker", "query": QUERY, "documents": DOCUMENTS}
    result = await execute(service, RERANK, body, priority=Priority.BATCH)
    assert {r["index"]: r["relevance_score"] for r in result["results"]} == pytest.approx(
        dict(enumerate(reference)), abs=1e-5
    )
    registry = service.metrics.registry
    batches = registry.get_sample_value("conveyor_batch_size_inputs_count", {"model": "ranker"})
    inputs = registry.get_sample_value("conveyor_batch_size_inputs_sum", {"model": "ranker"})
    assert inputs == len(DOCUMENTS) and batches is not None and batches < len(DOCUMENTS)


async def test_tokenize_works_on_a_rerank_model(client: httpx.AsyncClient) -> None:
    answer = (await client.post("/tokenize", json={"model": "ranker", "prompt": "the cat"})).json()
    assert answer["count"] == 4 and answer["max_model_len"] == 128  # [CLS] the cat [SEP]


def test_the_tiny_cross_encoder_s_tokenizer_knows_its_words(ranker_path: Path) -> None:
    # transformers 5's `BertTokenizer(vocab_file=...)` ignored the file and made every word
    # [UNK], so two documents of equal length scored the same and the order test failed.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ranker_path))
    encoded = tokenizer(QUERY, DOCUMENTS[0])
    assert tokenizer.unk_token_id not in encoded["input_ids"]
    assert set(encoded["token_type_ids"]) == {0, 1}  # query, then document
