"""Pushing and removing models: chunks reused across versions, shared chunks kept; the CLI."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.distribution.manifest import Manifest, chunk_key
from conveyor.distribution.push import push_model, remove_model
from conveyor.fakes import MemoryJobStore, MemoryObjectStore


def write_model(root: Path, weights: bytes) -> Path:
    """A model directory with a config and a weights file."""
    (root / "sub").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_bytes(b'{"dim": 8}')
    (root / "sub" / "weights.bin").write_bytes(weights)
    return root


def test_second_version_uploads_only_changed_chunks(tmp_path: Path) -> None:
    store, objects = MemoryJobStore(), MemoryObjectStore()
    first = push_model(
        write_model(tmp_path / "v1", b"A" * 8 + b"B" * 8 + b"C" * 8), "m", store, objects,
        chunk_bytes=8, now=1.0,
    )  # fmt: skip
    assert (first.num_uploaded, first.num_reused) == (5, 0)
    second = push_model(
        write_model(tmp_path / "v2", b"A" * 8 + b"X" * 8 + b"C" * 8), "m", store, objects,
        chunk_bytes=8, now=2.0,
    )  # fmt: skip
    assert (second.num_uploaded, second.num_reused, second.uploaded_bytes) == (1, 4, 8)
    record = store.get_manifest("m")
    assert record is not None and record.digest == second.manifest.digest
    manifest = Manifest.from_json(record.manifest_json)
    assert [f.path for f in manifest.files] == ["config.json", "sub/weights.bin"]
    for chunk in manifest.unique_chunks():
        assert objects.size(chunk_key(chunk.digest)) == chunk.size_bytes


def test_remove_keeps_chunks_another_model_uses(tmp_path: Path) -> None:
    store, objects = MemoryJobStore(), MemoryObjectStore()
    a = push_model(write_model(tmp_path / "a", b"S" * 8 + b"A" * 8), "a", store, objects,
                   chunk_bytes=8, now=1.0)  # fmt: skip
    push_model(write_model(tmp_path / "b", b"S" * 8 + b"B" * 8), "b", store, objects,
               chunk_bytes=8, now=1.0)  # fmt: skip
    assert remove_model("a", store, objects) == 1  # only the "A" chunk is a's alone
    assert remove_model("a", store, objects) is None
    shared = a.manifest.files[1].chunks[0].digest
    assert objects.exists(chunk_key(shared))
    assert [r.name for r in store.list_manifests()] == ["b"]


def test_cli_push_list_rm(tmp_path: Path) -> None:
    model = write_model(tmp_path / "model", b"w" * 3000)
    urls = ["--store", f"sqlite://{tmp_path}/jobs.db", "--objects", str(tmp_path / "objects")]
    runner = CliRunner()
    pushed = runner.invoke(app, ["models", "push", str(model), "--name", "tiny", *urls,
                                 "--chunk-mb", "0.001"])  # fmt: skip
    assert pushed.exit_code == 0, pushed.output
    assert "3 chunks uploaded" in pushed.output  # two equal chunks are stored once
    again = runner.invoke(app, ["models", "push", str(model), "--name", "tiny", *urls])
    assert again.exit_code == 0 and "already stored" in again.output
    listed = runner.invoke(app, ["models", "list", *urls])
    assert listed.output.startswith("tiny\t3010\t")
    removed = runner.invoke(app, ["models", "rm", "tiny", *urls])
    assert removed.exit_code == 0, removed.output
    assert runner.invoke(app, ["models", "rm", "tiny", *urls]).exit_code == 1
    bad = runner.invoke(app, ["models", "push", str(tmp_path / "none"), "--name", "x", *urls])
    assert bad.exit_code == 1 and "does not exist" in bad.output
