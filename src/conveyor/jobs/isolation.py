"""Finding a line that keeps killing its shard, by bisection across attempts.

A shard that was claimed `isolate_after_attempts` times without committing holds a line that
kills whatever runs it (a crash of the process, or an unexpected exception). From then on the
shard runs in pieces, and each piece leaves durable evidence in the object store:

- `started`: written before a piece runs;
- `done` (with `out` and `err`): written after it ran, holding its records.

A piece with `started` but no `done` died while running, so the next attempt splits it in
halves and runs those. Pieces already done are reused, never rerun. When a crashed piece is a
single line, that line is the culprit: it is reported in the error file (`request_isolated`)
and never run again. Each crash halves the suspect range, so a shard of n lines needs about
log2(n) extra attempts.

Pieces are keyed by line range, not attempt: their content is valid for whichever attempt
commits the shard, and the commit itself stays fenced by the lease.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from conveyor.jobs.keys import piece_key
from conveyor.jobs.sink import ShardSink
from conveyor.stores.object_store import ObjectStore


class PieceState(enum.Enum):
    """What the evidence says about a piece."""

    FRESH = "fresh"
    DONE = "done"
    CRASHED = "crashed"


@dataclass(frozen=True, slots=True)
class Piece:
    """Request indices `[start, end)` within a shard."""

    start: int
    end: int

    def __post_init__(self) -> None:
        """Reject empty or inverted ranges."""
        if not 0 <= self.start < self.end:
            raise ValueError(f"a piece needs 0 <= start < end, got [{self.start}, {self.end})")

    @property
    def size(self) -> int:
        """Number of requests in the piece."""
        return self.end - self.start

    def halves(self) -> tuple[Piece, Piece]:
        """The two halves of a piece of at least two lines."""
        middle = (self.start + self.end) // 2
        return Piece(self.start, middle), Piece(middle, self.end)


def plan_pieces(
    num_lines: int, probe: Callable[[Piece], PieceState], *, is_root_suspect: bool
) -> list[tuple[Piece, PieceState]]:
    """Cover `[0, num_lines)` in order with pieces; crashed ones are split to single lines.

    `is_root_suspect` treats a whole shard without evidence as crashed: earlier attempts of
    it died before isolation began, so running it whole again would only crash once more.
    """
    if num_lines < 1:
        return []
    plan: list[tuple[Piece, PieceState]] = []

    def visit(piece: Piece, state: PieceState) -> None:
        if state is PieceState.CRASHED and piece.size > 1:
            for half in piece.halves():
                visit(half, probe(half))
        else:
            plan.append((piece, state))

    root = Piece(0, num_lines)
    state = probe(root)
    if state is PieceState.FRESH and is_root_suspect:
        state = PieceState.CRASHED
    visit(root, state)
    return plan


class PieceCheckpoints:
    """The durable evidence of one shard's pieces (blocking: call from a thread)."""

    def __init__(self, objects: ObjectStore, batch_id: str, shard_index: int) -> None:
        """Checkpoints of shard `shard_index` of `batch_id`."""
        self._objects = objects
        self._batch_id = batch_id
        self._index = shard_index

    def _key(self, piece: Piece, kind: str) -> str:
        return piece_key(self._batch_id, self._index, piece.start, piece.end, kind)

    def probe(self, piece: Piece) -> PieceState:
        """What is known about `piece`."""
        if self._objects.exists(self._key(piece, "done")):
            return PieceState.DONE
        if self._objects.exists(self._key(piece, "started")):
            return PieceState.CRASHED
        return PieceState.FRESH

    def mark_started(self, piece: Piece) -> None:
        """Leave evidence that `piece` is about to run."""
        self._objects.put_stream(self._key(piece, "started"), [b""])

    def unmark_started(self, piece: Piece) -> None:
        """Withdraw the evidence of a piece that did not crash (its storage failed instead)."""
        self._objects.delete(self._key(piece, "started"))

    def save(self, piece: Piece, sink: ShardSink) -> None:
        """Persist a fully run piece; `done` is written last, so it implies the rest."""
        self._objects.put_stream(self._key(piece, "out"), sink.outputs.chunks())
        self._objects.put_stream(self._key(piece, "err"), sink.errors.chunks())
        counts = {"completed": sink.num_completed, "failed": sink.num_failed}
        self._objects.put_stream(self._key(piece, "done"), [orjson.dumps(counts)])

    def load_into(self, piece: Piece, sink: ShardSink) -> None:
        """Append a done piece's records and counts to `sink`."""
        counts = orjson.loads(b"".join(self._objects.iter_chunks(self._key(piece, "done"))))
        num_completed, num_failed = int(counts["completed"]), int(counts["failed"])
        sink.outputs.add_chunks(self._objects.iter_chunks(self._key(piece, "out")), num_completed)
        sink.errors.add_chunks(self._objects.iter_chunks(self._key(piece, "err")), num_failed)
        sink.num_completed += num_completed
        sink.num_failed += num_failed

    def delete(self, pieces: list[Piece]) -> None:
        """Remove the evidence of `pieces` and of every range they were split from."""
        ranges = {(p.start, p.end) for p in pieces}
        for piece in pieces:
            ranges.update(_ancestors(piece, max(p.end for p in pieces)))
        for start, end in ranges:
            for kind in ("started", "done", "out", "err"):
                self._objects.delete(piece_key(self._batch_id, self._index, start, end, kind))


def _ancestors(piece: Piece, num_lines: int) -> set[tuple[int, int]]:
    """Every range on the bisection path from `[0, num_lines)` down to `piece`."""
    found: set[tuple[int, int]] = set()
    current = Piece(0, num_lines)
    while current.size > 1 and current != piece:
        found.add((current.start, current.end))
        left, right = current.halves()
        current = left if piece.end <= left.end else right
    return found
