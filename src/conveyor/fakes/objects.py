"""An in-memory object store."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from conveyor.stores.errors import ObjectNotFoundError
from conveyor.stores.object_io import lines_of, validate_key

# Small on purpose: line splitting must cope with lines across chunks.
FAKE_CHUNK_BYTES = 7


class MemoryObjectStore:
    """`ObjectStore` over a dict; a write is atomic because the value is set at the end."""

    def __init__(self) -> None:
        """An empty store."""
        self.objects: dict[str, bytes] = {}

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write an object from chunks; return its size."""
        data = b"".join(chunks)
        self.objects[validate_key(key)] = data
        return len(data)

    def open_range(
        self, key: str, start: int, end: int, chunk_bytes: int = FAKE_CHUNK_BYTES
    ) -> Iterator[bytes]:
        """Bytes `[start, end)` in chunks of `chunk_bytes` (tiny by default)."""
        data = self._get(key)[start:end]
        return iter([data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)])

    def read_lines(self, key: str, start: int, end: int) -> Iterator[bytes]:
        """The lines of bytes `[start, end)`, without terminators."""
        return lines_of(self.open_range(key, start, end))

    def iter_chunks(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """A whole object."""
        return self.open_range(key, 0, len(self._get(key)), chunk_bytes)

    def size(self, key: str) -> int:
        """An object's size in bytes."""
        return len(self._get(key))

    def exists(self, key: str) -> bool:
        """Whether an object exists under `key`."""
        return key in self.objects

    def delete(self, key: str) -> bool:
        """Delete an object; whether it existed."""
        return self.objects.pop(key, None) is not None

    def _get(self, key: str) -> bytes:
        """An object's bytes, or ObjectNotFoundError."""
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectNotFoundError(key) from None
