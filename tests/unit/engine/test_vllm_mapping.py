"""``engine: vllm``'s pure mapping: config to engine arguments (LoRA's included), adapters to
LoRA requests, sampling parameters, grammars, logprobs and finish reasons; and the start-up
check without vLLM installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from conveyor.cli.startup_checks import generate_model_problems
from conveyor.config.model_config import GenerateModelConfig, LoraConfig
from conveyor.engine import vllm_mapping
from conveyor.engine.model.lora.registry import AdapterEntry
from conveyor.engine.outputs import FinishReason, TokenLogprobs
from conveyor.engine.sampling.grammar import grammar_from_json_schema, grammar_from_lark
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.vllm_mapping import (
    VLLM_INSTALL,
    engine_args,
    finish_reason,
    grammar_to_lark,
    lora_engine_args,
    lora_request_fields,
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


def test_the_vllm_map_needs_engine_vllm(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="need engine: vllm"):
        config(hf_dir(tmp_path), engine="conveyor", vllm={"enforce_eager": True})


def test_lora_turns_on_vllms_lora_at_a_rank_vllm_takes(tmp_path: Path) -> None:
    lora = {"max_loras_per_batch": 3, "max_cpu_loras": 5, "max_rank": 8}
    args = engine_args(config(hf_dir(tmp_path), lora=lora))
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 3, 8)
    assert args["max_cpu_loras"] == 5
    assert "enable_lora" not in engine_args(config(tmp_path))  # no lora: vLLM's stays off
    # A rank vLLM has no buffers for is rounded up (Conveyor still refuses above 10 itself).
    assert lora_engine_args("m", LoraConfig(max_rank=10))["max_lora_rank"] == 16
    assert lora_engine_args("m", LoraConfig(max_rank=512))["max_lora_rank"] == 512
    # vLLM wants at least as many host copies as device slots.
    assert lora_engine_args("m", LoraConfig(max_loras_per_batch=8, max_cpu_loras=2))[
        "max_cpu_loras"
    ] == 8  # fmt: skip
    assert engine_args(config(tmp_path, lora=lora, vllm={"max_loras": 1}))["max_loras"] == 1
    with pytest.raises(ValueError, match="largest LoRA rank vLLM serves"):
        engine_args(config(tmp_path, lora={"max_rank": 513}))


def test_an_adapter_is_a_lora_request_of_its_never_reused_id() -> None:
    sql = AdapterEntry(3, "sql", Path("/adapters/sql"), 8)
    fields = lora_request_fields(sql, {})
    assert fields == {"lora_name": "sql", "lora_int_id": 3, "lora_path": "/adapters/sql"}
    assert lora_request_fields(sql, {"sql": 3}) == fields  # its own name: the same request
    # Loaded again under that name: vLLM keys prefix blocks by name and path, so the new
    # weights get a name of their own there (and a new id: vLLM reads them anew).
    again = AdapterEntry(7, "sql", Path("/adapters/sql"), 8)
    assert lora_request_fields(again, {"sql": 3}) == {
        "lora_name": "sql@7", "lora_int_id": 7, "lora_path": "/adapters/sql"
    }  # fmt: skip


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
