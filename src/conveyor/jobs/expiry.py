"""File expiry: OpenAI's `expires_after` on uploads and `output_expires_after` on batches.

Both take `{"anchor": "created_at", "seconds": N}`; a file's `expires_at` is its creation time
plus N. The supervisor deletes expired files (record, then bytes) on each pass. The bytes of
an input file stay while a batch that has not finished reads them; finalizing that batch
deletes them (see `finalize`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from conveyor.errors import InvalidRequest
from conveyor.jobs.context import JobsContext
from conveyor.jobs.finalize import is_input_in_use

log = logging.getLogger(__name__)

ANCHOR = "created_at"
# Files deleted per supervisor pass; more wait for the next pass.
MAX_EXPIRED_PER_PASS = 100


def parse_expires_after(value: object, *, param: str, min_s: float, max_s: float) -> int | None:
    """The lifetime in seconds of `{"anchor": "created_at", "seconds": N}`; None if absent.

    400 (naming `param`) for another shape, anchor, or `seconds` outside `[min_s, max_s]`.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"anchor", "seconds"}:
        raise InvalidRequest(
            f"{param} must be {{'anchor': 'created_at', 'seconds': N}}", param=param
        )
    if value["anchor"] != ANCHOR:
        raise InvalidRequest(f"{param}.anchor must be {ANCHOR!r}", param=f"{param}.anchor")
    seconds = value["seconds"]
    if isinstance(seconds, str) and seconds.strip().isdigit():
        seconds = int(seconds)  # multipart form fields arrive as text
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not min_s <= seconds <= max_s:
        raise InvalidRequest(
            f"{param}.seconds must be an integer between {min_s:g} and {max_s:g}",
            param=f"{param}.seconds",
        )
    return seconds


def form_expires_after(fields: Mapping[str, str]) -> dict[str, str] | None:
    """`expires_after` from multipart fields `expires_after[anchor]` and `[seconds]`."""
    prefix = "expires_after["
    parts = {
        k[len(prefix) : -1]: v for k, v in fields.items() if k.startswith(prefix) and k[-1] == "]"
    }
    return parts or None


def expires_at(created_at: int, lifetime_s: int | None) -> int | None:
    """When a file created at `created_at` with that lifetime expires (None: never)."""
    return None if lifetime_s is None else created_at + lifetime_s


def delete_expired_files(ctx: JobsContext) -> int:
    """Blocking: delete up to `MAX_EXPIRED_PER_PASS` expired files; return how many.

    The bytes go first, then the record, so a failure between the two leaves a record that
    the next pass finds again (an object store error propagates to the supervisor's retry).
    """
    store = ctx.store.blocking
    num_deleted = 0
    for record in store.expired_files(ctx.clock(), MAX_EXPIRED_PER_PASS):
        if not is_input_in_use(store, record.id):  # else the batch's finalizer deletes them
            ctx.objects.for_tenant(record.tenant).delete(record.object_key)
        if store.delete_file(record.tenant, record.id):
            num_deleted += 1
    if num_deleted:
        log.info("deleted %d expired files", num_deleted)
    return num_deleted
