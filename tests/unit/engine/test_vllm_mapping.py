"""``engine: vllm``'s pure mapping: config to engine arguments, sampling parameters,
grammars, logprobs and finish reasons; and the start-up check without vLLM installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from conveyor.cli.startup_checks import generate_model_problems
from conveyor.config.model_config import GenerateModelConfig
from conveyor.engine import vllm_mapping
from conveyor.engine.outputs import FinishReason, TokenLogprobs
from conveyor.engine.sampling.grammar import grammar_from_json_schema, grammar_from_lark
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.vllm_mapping import (
    VLLM_INSTALL,
    engine_args,
    finish_reason,
    grammar_to_lark,
    prompt_entries,
    sampling_kwargs,
    token_logprobs,
)
from conveyor.priority import Priority

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
         "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "max_position_embeddings": 256}  # fmt: skip


def hf_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    return tmp_path


def config(path: Path, **fields: object) -> GenerateModelConfig:
    return GenerateModelConfig.model_validate(
        {"kind": "generate", "name": "m", "path": str(path), "engine": "vllm", **fields}
    )


def test_engine_args_carry_conveyors_limits_then_the_vllm_map(tmp_path: Path) -> None:
    args = engine_args(config(hf_dir(tmp_path), max_num_seqs=8, max_model_len=128,
                              dtype="float32", vllm={"enforce_eager": True, "max_num_seqs": 4}))  # fmt: skip
    assert args["model"] == str(tmp_path) and args["served_model_name"] == "m"
    assert args["scheduling_policy"] == "priority"  # online before batch
    assert args["structured_outputs_config"] == {"backend": "guidance"}
    assert args["max_model_len"] == 128 and args["dtype"] == "float32"
    assert args["enforce_eager"] is True and args["max_num_seqs"] == 4  # the map wins
    assert "dtype" not in engine_args(config(tmp_path))  # auto: vLLM's own choice


def test_a_gguf_file_is_refused_with_the_import_command(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="conveyor models import"):
        engine_args(config(gguf))


def test_the_vllm_map_and_lora_need_the_right_engine(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="need engine: vllm"):
        config(hf_dir(tmp_path), engine="conveyor", vllm={"enforce_eager": True})
    with pytest.raises(ValidationError, match="not yet served"):
        config(tmp_path, lora={"adapters": {}})


def test_without_vllm_the_start_up_check_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("conveyor.cli.startup_checks.is_vllm_installed", lambda: False)
    assert generate_model_problems(config(hf_dir(tmp_path))) == [f"model 'm': {VLLM_INSTALL}"]
    assert "pip install 'conveyor[vllm]'" in VLLM_INSTALL and "\n" not in VLLM_INSTALL


def test_serve_and_worker_stop_at_start_up_with_that_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from conveyor.cli.main import app

    monkeypatch.setattr("conveyor.cli.startup_checks.is_vllm_installed", lambda: False)
    model = {"kind": "generate", "name": "m", "path": str(hf_dir(tmp_path)), "engine": "vllm"}
    path = tmp_path / "conveyor.yaml"
    path.write_text(json.dumps({"models": [model], "data_dir": str(tmp_path / "data")}))
    for argv in (["check-config", str(path)], ["serve", "--config", str(path)],
                 ["worker", "--config", str(path), "--store", f"sqlite:///{tmp_path}/s.db"]):  # fmt: skip
        result = CliRunner().invoke(app, argv)
        assert result.exit_code != 0, argv
        assert result.output.strip().splitlines() == [f"model 'm': {VLLM_INSTALL}"], argv


def test_sampling_keywords_leave_stop_strings_to_conveyor() -> None:
    params = SamplingParams(temperature=0.5, top_k=-1, max_tokens=9, stop=["END"], seed=3,
                            stop_token_ids=[7, 2], logprobs=2, logit_bias=[(5, 1.5)])  # fmt: skip
    kwargs = sampling_kwargs(params, max_output_tokens=6)
    assert "stop" not in kwargs and kwargs["detokenize"] is False
    assert kwargs["max_tokens"] == 6 and kwargs["top_k"] == 0 and kwargs["seed"] == 3
    assert kwargs["stop_token_ids"] == [2, 7] and kwargs["logit_bias"] == {5: 1.5}
    assert sampling_kwargs(params, max_output_tokens=0)["max_tokens"] == 1  # runs one, drops it
    assert "structured" not in kwargs
    assert vllm_mapping.vllm_priority(Priority.ONLINE) < vllm_mapping.vllm_priority(Priority.BATCH)


def test_grammars_go_to_vllm_as_lark() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    lark = grammar_to_lark(grammar_from_json_schema(schema))
    assert lark.startswith("start: %json {")
    embedded = json.loads(lark[len("start: %json ") :])
    assert embedded["properties"] == schema["properties"]
    assert embedded["x-guidance"]["whitespace_flexible"] is False  # Conveyor's compact JSON
    tool = grammar_from_lark('start: "x" %json {"type": "object"}')
    assert grammar_to_lark(tool) == tool
    params = SamplingParams(grammar=grammar_from_json_schema(schema))
    assert sampling_kwargs(params, 4)["structured"] == lark
    with pytest.raises(ValueError, match="one JSON-schema or Lark grammar"):
        grammar_to_lark('{"grammars": [{"json_schema": {}}, {"json_schema": {}}]}')


def test_logprobs_keep_the_top_ones_by_rank_and_the_chosen_one() -> None:
    entries = {9: (-3.0, 4), 1: (-0.5, 1), 2: (-1.0, 2)}
    assert token_logprobs(9, entries, 2) == TokenLogprobs(9, -3.0, ((1, -0.5), (2, -1.0)))
    assert token_logprobs(1, {1: (-0.5, 1)}, 0) == TokenLogprobs(1, -0.5, ())
    first = prompt_entries([4, 9, 1], [None, entries, entries], 1)
    assert first == [TokenLogprobs(9, -3.0, ((1, -0.5),)), TokenLogprobs(1, -0.5, ((1, -0.5),))]


def test_finish_reasons() -> None:
    assert finish_reason("stop") is FinishReason.STOP
    assert finish_reason("length") is FinishReason.LENGTH
    assert finish_reason("abort") is None and finish_reason(None) is None
