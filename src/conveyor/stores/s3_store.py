"""The S3 (or S3-compatible) object store: see `object_store` for the contract.

boto3 is imported on first use (`pip install conveyor[s3]`). A connection failure, timeout or
5xx answer is `ObjectStoreUnavailableError` (the API's 503); other S3 errors stay plain.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from conveyor.stores.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from conveyor.stores.object_io import (
    DEFAULT_CHUNK_BYTES,
    check_chunk_bytes,
    check_range,
    lines_of,
    validate_key,
)

# S3 rejects multipart parts smaller than 5 MiB (except the last one).
MIN_S3_PART_BYTES = 5 * 1024 * 1024
DEFAULT_S3_PART_BYTES = 8 * 1024 * 1024

_T = TypeVar("_T")


class S3ObjectStore:
    """Objects in an S3 (or S3-compatible) bucket under an optional key prefix.

    Small objects are one PutObject; larger streams become a multipart upload of `part_bytes`
    parts, aborted on failure. S3 only shows an object once it is complete, so readers never
    see a half-written key. boto3 is imported on first use (`pip install conveyor[s3]`).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        part_bytes: int = DEFAULT_S3_PART_BYTES,
        endpoint_url: str | None = None,
        region: str | None = None,
    ) -> None:
        """Use `client` if given, else build a boto3 S3 client (env credentials)."""
        if not bucket:
            raise ValueError("bucket must be a non-empty string")
        if part_bytes < MIN_S3_PART_BYTES:
            raise ValueError(f"part_bytes must be >= {MIN_S3_PART_BYTES}, got {part_bytes}")
        botocore_errors = _import_optional("botocore.exceptions")
        self._errors: tuple[type[Exception], ...] = (
            botocore_errors.ClientError,
            botocore_errors.BotoCoreError,
        )
        # No connection, a timeout or a dropped connection: S3 may well answer later.
        self._transport_errors: tuple[type[Exception], ...] = (
            botocore_errors.ConnectionError,
            botocore_errors.HTTPClientError,
        )
        if client is None:
            client = _import_optional("boto3").client(
                "s3", endpoint_url=endpoint_url, region_name=region
            )
        self._client = client
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._part_bytes = part_bytes

    def _key(self, key: str) -> str:
        """Full S3 key of a (validated) store key."""
        return self._prefix + validate_key(key)

    def _call(self, key: str, action: Callable[[], _T]) -> _T:
        """Run an S3 call, translating its errors (404s become ObjectNotFoundError)."""
        try:
            return action()
        except self._errors as exc:
            if _s3_error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFoundError(key) from exc
            if _is_s3_unavailable(exc, self._transport_errors):
                raise ObjectStoreUnavailableError(f"s3 unavailable on {key!r}: {exc}") from exc
            raise ObjectStoreError(f"s3 error on {key!r}: {exc}") from exc

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write an object from chunks, atomically; return the number of bytes written.

        Holds at most one part (plus one incoming chunk) in memory.
        """
        target = self._key(key)
        upload = _MultipartUpload(self._client, self._bucket, target)
        buffer = bytearray()
        num_bytes = 0
        try:
            for chunk in chunks:
                buffer += chunk
                num_bytes += len(chunk)
                while len(buffer) >= self._part_bytes:
                    part = bytes(buffer[: self._part_bytes])
                    del buffer[: self._part_bytes]
                    self._call(key, functools.partial(upload.add_part, part))
            if upload.is_started:
                self._call(key, lambda: upload.finish(bytes(buffer)))
            else:
                body = bytes(buffer)
                self._call(
                    key, lambda: self._client.put_object(Bucket=self._bucket, Key=target, Body=body)
                )
        except BaseException:
            upload.abort()
            raise
        return num_bytes

    def open_range(
        self, key: str, start: int, end: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[bytes]:
        """Stream bytes `[start, end)` of an object (`end` is clamped to its size).

        A missing key raises ObjectNotFoundError here, not on the first read.
        """
        check_range(start, end)
        check_chunk_bytes(chunk_bytes)
        if start == end or start >= self.size(key):
            # S3 answers an empty or out-of-bounds Range with 416; an empty read is the answer.
            return iter(())
        response = self._call(
            key,
            lambda: self._client.get_object(
                Bucket=self._bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}"
            ),
        )
        return self._stream_body(key, response["Body"], chunk_bytes)

    def _stream_body(self, key: str, body: Any, chunk_bytes: int) -> Iterator[bytes]:
        """Yield a response body's chunks, closing it at the end."""
        try:
            while True:
                chunk = self._call(key, lambda: body.read(chunk_bytes))
                if not chunk:
                    return
                yield bytes(chunk)
        finally:
            body.close()

    def read_lines(self, key: str, start: int, end: int) -> Iterator[bytes]:
        """Stream the lines of bytes `[start, end)`, without their line terminators."""
        return lines_of(self.open_range(key, start, end))

    def iter_chunks(self, key: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        """Stream a whole object."""
        check_chunk_bytes(chunk_bytes)
        response = self._call(
            key, lambda: self._client.get_object(Bucket=self._bucket, Key=self._key(key))
        )
        return self._stream_body(key, response["Body"], chunk_bytes)

    def size(self, key: str) -> int:
        """Return an object's size in bytes."""
        head = self._call(
            key, lambda: self._client.head_object(Bucket=self._bucket, Key=self._key(key))
        )
        return int(head["ContentLength"])

    def exists(self, key: str) -> bool:
        """Return whether an object exists under `key`."""
        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def delete(self, key: str) -> bool:
        """Delete an object; return whether it existed."""
        if not self.exists(key):
            return False
        self._call(key, lambda: self._client.delete_object(Bucket=self._bucket, Key=self._key(key)))
        return True


class _MultipartUpload:
    """A multipart upload, started lazily on the first full part."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        """Prepare (but do not start) an upload of `key`."""
        self._client = client
        self._bucket = bucket
        self._key = key
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    @property
    def is_started(self) -> bool:
        """Whether S3 already holds an open upload for this key."""
        return self._upload_id is not None

    def add_part(self, data: bytes) -> None:
        """Upload the next part, starting the upload if needed."""
        if self._upload_id is None:
            created = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._key)
            self._upload_id = str(created["UploadId"])
        number = len(self._parts) + 1
        response = self._client.upload_part(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=data,
        )
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})

    def finish(self, tail: bytes) -> None:
        """Upload the remaining bytes as the last part and publish the object."""
        if tail:
            self.add_part(tail)
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._upload_id = None

    def abort(self) -> None:
        """Discard uploaded parts; best effort, since we are already handling a failure."""
        if self._upload_id is None:
            return
        with contextlib.suppress(Exception):
            self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id
            )
        self._upload_id = None


# -- helpers (private) -------------------------------------------------------------------------


def _import_optional(module: str) -> Any:
    """Import an optional dependency (boto3/botocore), explaining how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module} is required for S3 storage: pip install 'conveyor[s3]'"
        ) from exc


def _is_s3_unavailable(exc: Exception, transport_errors: tuple[type[Exception], ...]) -> bool:
    """Whether a botocore error means S3 cannot serve now: no connection, timeout, 5xx."""
    if isinstance(exc, transport_errors):
        return True
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return (isinstance(status, int) and status >= 500) or _s3_error_code(exc) == "SlowDown"


def _s3_error_code(exc: Exception) -> str:
    """The error code of a botocore ClientError ('' for other errors)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))
