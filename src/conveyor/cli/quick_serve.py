"""``conveyor serve PATH_OR_NAME``: one model's config entry from a directory or a name.

What a vLLM or TEI user types: a checkpoint and a few flags, no YAML. The kind comes from
the checkpoint's ``architectures`` unless ``--kind`` names it; a ``.gguf`` file is generative.
The default models' names serve them from their packages (SmolLM2 with its default settings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conveyor.config.model_config import (
    CHAT_MODEL_INSTALL,
    DEFAULT_CHAT_MODEL_NAME,
    DEFAULT_MODEL_NAME,
    bundled_chat_model_path,
)
from conveyor.config.settings import DEFAULT_CHAT_MODEL_SETTINGS
from conveyor.errors import ConfigError

KINDS = ("embedding", "generate", "rerank")
# Flags that only mean something for some kinds, and the kinds they belong to.
KIND_OPTIONS = {
    "max_num_seqs": ("generate",),
    "max_model_len": ("generate",),
    "kv_cache_tokens": ("generate",),
    "max_batch_size": ("embedding", "rerank"),
    "max_wait_ms": ("embedding", "rerank"),
}


def resolve_checkpoint(path_or_name: str) -> Path | None:
    """The model's directory or GGUF file; None for the bundled MiniLM; a cached hub name
    works offline."""
    path = Path(path_or_name).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path.resolve()
    if path_or_name == DEFAULT_MODEL_NAME:
        return None
    if path_or_name == DEFAULT_CHAT_MODEL_NAME:
        bundled = bundled_chat_model_path()
        if bundled is None:
            raise ConfigError(f"{DEFAULT_CHAT_MODEL_NAME} needs its package: {CHAT_MODEL_INSTALL}")
        return bundled
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_name, local_files_only=True))
    except Exception:  # not cached, or not a valid hub name: the same answer either way
        raise ConfigError(
            f"{path_or_name!r} is neither a model directory nor a model in the local Hugging "
            "Face cache (Conveyor does not download models)"
        ) from None


def detect_kind(checkpoint: Path | None) -> str:
    """``generate`` for a causal LM, ``rerank`` for sequence classification, else embedding."""
    if checkpoint is None:
        return "embedding"
    if checkpoint.is_file():
        return "generate"  # a .gguf file: only generative architectures load from one
    config_path = checkpoint / "config.json"
    try:
        architectures = json.loads(config_path.read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config_path}: {exc}") from None
    if any(str(name).endswith("ForCausalLM") for name in architectures):
        return "generate"
    if any(str(name).endswith("ForSequenceClassification") for name in architectures):
        return "rerank"
    return "embedding"


def model_entry(
    path_or_name: str,
    *,
    served_model_name: str | None,
    kind: str | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    """The ``models`` entry for one model; flags that do not fit its kind are an error."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    checkpoint = resolve_checkpoint(path_or_name)
    kind = kind or detect_kind(checkpoint)
    given = {key: value for key, value in options.items() if value is not None}
    for key in given:
        kinds = KIND_OPTIONS.get(key)
        if kinds is not None and kind not in kinds:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} applies to {' and '.join(kinds)} models, not {kind}")
    name = served_model_name or _default_name(path_or_name, checkpoint)
    defaults = DEFAULT_CHAT_MODEL_SETTINGS if path_or_name == DEFAULT_CHAT_MODEL_NAME else {}
    entry: dict[str, Any] = {"name": name, "kind": kind, **defaults, **given}
    if checkpoint is not None:
        entry["path"] = str(checkpoint)
    return entry


def _default_name(path_or_name: str, checkpoint: Path | None) -> str:
    """A directory's name, a GGUF file's stem, else what was typed (a model's name)."""
    typed = Path(path_or_name).expanduser()
    if checkpoint is None or not typed.exists():
        return path_or_name
    return checkpoint.stem if checkpoint.is_file() else checkpoint.name


def quick_models(path_or_name: str | None, flags: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The ``models`` override for ``serve MODEL --flags``; None (the file's) without MODEL."""
    options = dict(flags)
    served_model_name = options.pop("served_model_name", None)
    kind = options.pop("kind", None)
    if path_or_name is None:
        given = [key for key, value in flags.items() if value is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ConfigError(f"{flag} needs a MODEL argument (or set it in the config file)")
        return None
    return [model_entry(path_or_name, served_model_name=served_model_name, kind=kind,
                        options=options)]  # fmt: skip
