"""Run one benchmark script in its smoke mode, as the bench smoke tests do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 300


def run_smoke(module: str, out_dir: Path, *args: str) -> Path:
    """``python -m MODULE --smoke --out OUT_DIR [ARGS]`` from the repo root; fail with its
    stderr."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--smoke", f"--out={out_dir}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"{module} --smoke failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return out_dir
