"""The gateway hashes a prompt as the engine caches it: its keys are in the engine's digest."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from conveyor.engine.sampling.params import SamplingParams
from conveyor.fleet.affinity import AffinitySettings, matched_blocks
from conveyor.fleet.route_hint import HintReader
from conveyor.prefix.report import parse_prefix_report, prefix_report
from tests.unit.model_helpers import collect, engine_config, running_engine, submit, wait_idle

pytestmark = [pytest.mark.anyio, pytest.mark.model]

MESSAGES = [
    {"role": "system", "content": "You are a batching server. Answer in one line."},
    {"role": "user", "content": "Paged attention stores keys and values in fixed-size blocks."},
    {"role": "assistant", "content": "A block table maps positions to blocks."},
    {"role": "user", "content": "And continuous batching?"},
]


async def test_the_engine_digest_holds_the_gateways_prompt_keys(llama_path: Path) -> None:
    config = engine_config(block_size=4, max_model_len=256)
    reader = HintReader({"m": str(llama_path)}, AffinitySettings())
    body = orjson.dumps({"model": "m", "messages": MESSAGES})
    hint = reader.affinity("/v1/chat/completions", [], body, "m")
    assert hint is not None and hint.prompt is not None
    keys = hint.prompt.keys(config.block_size)
    assert len(keys) >= 10
    with running_engine(llama_path, config) as engine:
        # The engine gets the ids its own (transformers) tokenizer makes for the chat.
        prompt = engine._tokenizer.apply_chat_template(MESSAGES)
        stream = submit(
            engine, prompt, SamplingParams(temperature=0.0, max_tokens=3), request_id="r"
        )
        await collect(stream)
        await wait_idle(engine)
        report = prefix_report(config.block_size, engine.prefix_digest.hashes)
    holdings = parse_prefix_report(orjson.loads(orjson.dumps(report)))
    assert holdings is not None
    assert matched_blocks(keys, holdings) == len(keys)


async def test_another_prompt_matches_only_the_shared_head(llama_path: Path) -> None:
    config = engine_config(block_size=4, max_model_len=256)
    reader = HintReader({"m": str(llama_path)}, AffinitySettings())
    other = [MESSAGES[0], {"role": "user", "content": "Something else entirely, about foxes."}]
    hint = reader.affinity("/v1/chat/completions", [], orjson.dumps({"messages": other}), "m")
    assert hint is not None and hint.prompt is not None
    keys = hint.prompt.keys(config.block_size)
    with running_engine(llama_path, config) as engine:
        prompt = engine._tokenizer.apply_chat_template(MESSAGES)
        await collect(submit(engine, prompt, SamplingParams(max_tokens=1), request_id="r"))
        await wait_idle(engine)
        holdings = parse_prefix_report(prefix_report(4, engine.prefix_digest.hashes))
    shared = 0
    mine = engine._tokenizer.apply_chat_template(other)
    while shared < min(len(prompt), len(mine)) and prompt[shared] == mine[shared]:
        shared += 1
    assert 0 < matched_blocks(keys, holdings) == shared // 4 < len(keys)
