"""Bisection across attempts: a line that keeps crashing its shard is found and isolated."""

from __future__ import annotations

import pytest

from conveyor.jobs.isolation import Piece, PieceCheckpoints, PieceState, plan_pieces
from conveyor.jobs.sink import ShardSink
from tests.unit.jobs.fakes import MemoryObjectStore


def test_fresh_shard_is_one_piece_unless_suspect() -> None:
    probe = lambda piece: PieceState.FRESH  # noqa: E731
    assert plan_pieces(8, probe, is_root_suspect=False) == [(Piece(0, 8), PieceState.FRESH)]
    assert plan_pieces(8, probe, is_root_suspect=True) == [
        (Piece(0, 4), PieceState.FRESH),
        (Piece(4, 8), PieceState.FRESH),
    ]
    assert plan_pieces(0, probe, is_root_suspect=True) == []


def test_done_pieces_are_reused_and_crashed_ones_split() -> None:
    states = {(0, 8): PieceState.CRASHED, (0, 4): PieceState.DONE, (4, 8): PieceState.CRASHED,
              (4, 6): PieceState.CRASHED, (4, 5): PieceState.CRASHED}  # fmt: skip
    plan = plan_pieces(8, lambda p: states.get((p.start, p.end), PieceState.FRESH),
                       is_root_suspect=True)  # fmt: skip
    assert [(p.start, p.end, s) for p, s in plan] == [
        (0, 4, PieceState.DONE),
        (4, 5, PieceState.CRASHED),
        (5, 6, PieceState.FRESH),
        (6, 8, PieceState.FRESH),
    ]


@pytest.mark.parametrize(("num_lines", "poison"), [(1, 0), (2, 1), (13, 6), (100, 0), (100, 99)])
def test_repeated_crashes_converge_on_the_poison_line(num_lines: int, poison: int) -> None:
    """Simulate attempts that die whenever they run the poison line."""
    checkpoints = PieceCheckpoints(MemoryObjectStore(), "batch_x", 0)
    for num_attempts in range(1, 3 + num_lines.bit_length() * 2):  # noqa: B007
        plan = plan_pieces(num_lines, checkpoints.probe, is_root_suspect=True)
        crashed = False
        for piece, state in plan:
            if state is not PieceState.FRESH:
                continue
            checkpoints.mark_started(piece)
            if piece.start <= poison < piece.end:
                crashed = True
                break
            checkpoints.save(piece, ShardSink())
        if not crashed:
            break
    isolated = [p.start for p, s in plan if s is PieceState.CRASHED]
    assert not crashed and isolated == [poison]
    assert num_attempts <= num_lines.bit_length() + 1  # one crash per halving
    covered = sorted(i for p, _ in plan for i in range(p.start, p.end))
    assert covered == list(range(num_lines))


def test_checkpoints_round_trip_and_clean_up() -> None:
    objects = MemoryObjectStore()
    checkpoints = PieceCheckpoints(objects, "batch_x", 2)
    piece = Piece(0, 2)
    sink = ShardSink()
    sink.add_output(b'{"ok":1}\n')
    sink.add_failure(b'{"bad":1}\n')
    checkpoints.mark_started(piece)
    assert checkpoints.probe(piece) is PieceState.CRASHED
    checkpoints.save(piece, sink)
    assert checkpoints.probe(piece) is PieceState.DONE
    target = ShardSink()
    checkpoints.load_into(piece, target)
    assert (target.num_completed, target.num_failed) == (1, 1)
    assert b"".join(target.outputs.chunks()) == b'{"ok":1}\n'
    checkpoints.delete([Piece(0, 1), Piece(1, 2)])
    assert objects.objects == {}
    sink.close()
    target.close()


def test_pieces_must_not_be_empty() -> None:
    with pytest.raises(ValueError):
        Piece(3, 3)
