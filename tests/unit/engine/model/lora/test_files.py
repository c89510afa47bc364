"""Which adapter paths and files the server reads: only under the allowed roots, only regular
files within their bounds, and one message for every refusal (nothing tells a missing
directory from a forbidden one). Torch-free."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.engine.model.lora.files import (
    CONFIG_FILE,
    CONFIG_MAX_BYTES,
    REFUSAL,
    AdapterRefused,
    read_adapter_file,
    resolve_under,
)

# A FIFO opened without O_NONBLOCK would wait for a writer forever: the bound fails the test.
pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    allowed = tmp_path / "adapters"
    good = allowed / "good"
    good.mkdir(parents=True)
    (good / CONFIG_FILE).write_text('{"r": 4}')
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / CONFIG_FILE).write_text('{"r": 8}')
    return allowed


def refused(call: object) -> str:
    """The message of the refusal `call()` raises."""
    assert callable(call)
    with pytest.raises(AdapterRefused) as caught:
        call()
    assert caught.value.status_code == 400 and caught.value.param == "lora_path"
    return caught.value.message


def test_a_path_under_a_root_resolves_and_its_config_is_read(root: Path) -> None:
    resolved = resolve_under(str(root / "good"), [root])
    assert resolved == (root / "good").resolve()
    assert read_adapter_file(resolved, CONFIG_FILE, CONFIG_MAX_BYTES) == b'{"r": 4}'
    # A root given through a symlink still holds what lies under its target.
    alias = root.parent / "alias"
    alias.symlink_to(root)
    assert resolve_under(str(alias / "good"), [alias]) == resolved


def test_every_path_outside_the_roots_gets_the_same_message(root: Path) -> None:
    escape = root / "escape"
    escape.symlink_to(root.parent / "secret")  # a symlink out of the root
    paths = [
        root.parent / "secret",  # exists, outside
        root / ".." / "secret",  # climbs out
        escape,
        root.parent / "nowhere",  # does not exist, outside
        Path("/"),
    ]
    messages = {refused(lambda p=p: resolve_under(str(p), [root])) for p in paths}
    assert messages == {REFUSAL}


def test_every_file_that_is_not_read_gets_the_same_message(root: Path, tmp_path: Path) -> None:
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / CONFIG_FILE)  # would hang a plain open()
    big = root / "big"
    big.mkdir()
    with (big / CONFIG_FILE).open("wb") as out:
        out.truncate(CONFIG_MAX_BYTES + 1)  # sparse: its size is what counts
    linked = root / "linked"
    linked.mkdir()
    (linked / CONFIG_FILE).symlink_to(tmp_path / "secret" / CONFIG_FILE)
    folder = root / "folder"
    (folder / CONFIG_FILE).mkdir(parents=True)
    dev = root / "dev"
    dev.mkdir()
    (dev / CONFIG_FILE).symlink_to("/dev/zero")
    directories = [root / "missing", root / "good" / CONFIG_FILE, fifo, big, linked, folder, dev]
    messages = {
        refused(lambda d=d: read_adapter_file(d, CONFIG_FILE, CONFIG_MAX_BYTES))
        for d in directories
    }
    empty = root / "empty"
    empty.mkdir()  # no config file at all
    messages.add(refused(lambda: read_adapter_file(empty, CONFIG_FILE, CONFIG_MAX_BYTES)))
    assert messages == {REFUSAL}
    assert all(str(tmp_path) not in m for m in messages)


def test_a_file_above_its_bound_is_refused_and_one_at_it_is_read(root: Path) -> None:
    weights = root / "good" / "adapter_model.safetensors"
    weights.write_bytes(b"x" * 100)
    assert read_adapter_file(root / "good", weights.name, 100) == b"x" * 100
    assert refused(lambda: read_adapter_file(root / "good", weights.name, 99)) == REFUSAL


def test_no_roots_refuse_everything(root: Path) -> None:
    assert refused(lambda: resolve_under(str(root / "good"), [])) == REFUSAL
