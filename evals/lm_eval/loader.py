"""Loads the questions beside this file for lm-evaluation-harness (``custom_dataset``).

Read from this directory, not through the Hugging Face hub or the ``datasets`` cache, so
the tasks run offline from any working directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

HERE = Path(__file__).resolve().parent


def _questions(name: str) -> datasets.DatasetDict:
    """The ``test`` split: one row per line of ``name`` beside this file."""
    lines = (HERE / name).read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def multiple_choice(**_: Any) -> datasets.DatasetDict:
    """50 questions, four choices each; ``answer`` is the index of the right one."""
    return _questions("conveyor_mc.jsonl")


def generate_until(**_: Any) -> datasets.DatasetDict:
    """20 questions with a short ``answer``."""
    return _questions("conveyor_gen.jsonl")
