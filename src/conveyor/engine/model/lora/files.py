"""Which adapter directories and files the server reads, and how (torch-free).

A run-time load names a path on this server, so it is held to the model's
``lora.load_roots``: the path is resolved (symlinks, ``..``) and must lie under a resolved
root. Every file is opened relative to its directory with ``O_NOFOLLOW | O_NONBLOCK`` (a
symlink is not followed, a FIFO cannot block the call), checked with ``fstat`` to be a
regular file within its size bound, and read through that same descriptor. Whatever the
reason a path or file is refused (missing, outside the roots, a FIFO, too large), the caller
gets the same message, so answers reveal nothing of what exists on the server; the reason
goes to the log.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from conveyor.errors import InvalidRequest

__all__ = [
    "CONFIG_FILE",
    "CONFIG_MAX_BYTES",
    "REFUSAL",
    "WEIGHTS_FILE",
    "AdapterError",
    "AdapterRefused",
    "read_adapter_file",
    "resolve_under",
]

log = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# A PEFT config is a few hundred bytes; a bound far above that still refuses a file that
# would take memory to parse.
CONFIG_MAX_BYTES = 1 << 20
REFUSAL = (
    "cannot load this LoRA adapter: lora_path must be a directory under the model's "
    f"lora.load_roots holding {CONFIG_FILE} and {WEIGHTS_FILE} as regular files within "
    "their size limits"
)
# Linux reads at most about 2 GiB at once; larger files are read in parts.
MAX_READ_BYTES = 1 << 30
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class AdapterError(InvalidRequest):
    """An adapter directory that cannot be served (missing files, unsupported options): 400."""


class AdapterRefused(AdapterError):
    """A path or file the server will not read: one message whatever the reason (logged)."""

    def __init__(self, reason: str) -> None:
        """Log ``reason``; the caller sees `REFUSAL` only."""
        super().__init__(REFUSAL, param="lora_path")
        self.reason = reason
        log.warning("LoRA adapter refused: %s", reason)


def resolve_under(path: str | Path, roots: Sequence[Path]) -> Path:
    """``path`` resolved, if it lies under one of the resolved ``roots``; else refused."""
    resolved = Path(os.path.realpath(path))
    for root in roots:
        if resolved.is_relative_to(os.path.realpath(root)):
            return resolved
    raise AdapterRefused(f"{str(path)!r} resolves to {resolved}, outside lora.load_roots")


def read_adapter_file(directory: Path, name: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``name`` in ``directory``, at most ``max_bytes``."""
    try:
        dir_fd = os.open(os.path.realpath(directory), _DIR_FLAGS)
    except OSError as exc:
        raise AdapterRefused(f"{directory}: {exc.strerror}") from None
    try:
        return _read_regular(dir_fd, directory / name, max_bytes)
    finally:
        os.close(dir_fd)


def _read_regular(dir_fd: int, path: Path, max_bytes: int) -> bytes:
    """Open ``path.name`` in ``dir_fd`` without following or blocking; check, then read it."""
    try:
        fd = os.open(path.name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise AdapterRefused(f"{path}: {exc.strerror}") from None
    try:
        size = _regular_size(fd, path, max_bytes)
        # One byte past the size tells a file that grew since fstat.
        data = _read_upto(fd, size + 1)
    except OSError as exc:
        raise AdapterRefused(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise AdapterRefused(f"{path} grew past {max_bytes} bytes while read")
    return data


def _regular_size(fd: int, path: Path, max_bytes: int) -> int:
    """The size of the file open as ``fd``; refused unless regular and within the bound."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise AdapterRefused(f"{path} is not a regular file")
    if info.st_size > max_bytes:
        raise AdapterRefused(f"{path} holds {info.st_size} bytes, above {max_bytes}")
    return info.st_size


def _read_upto(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``, to its end: one read (no copy) unless it is large."""
    parts: list[bytes] = []
    remaining = limit
    while remaining > 0 and (part := os.read(fd, min(remaining, MAX_READ_BYTES))):
        parts.append(part)
        remaining -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)
