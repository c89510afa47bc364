"""Model distribution under faults, with real worker processes on loopback (SQLite, local origin).

A seed worker pulls the pushed tiny Llama from the origin and serves it to peers with its
upload capped (`--peer-upload-mb-s`), so pulls from it take seconds and can be cut short:
- a seed SIGKILLed mid-transfer does not stall the workers pulling from it (they fall back to
  each other and the origin), and its holds, once older than 5 s, are not even asked;
- a worker that joins while another is still pulling finishes, from peers only;
- a worker SIGKILLed mid-pull resumes with the chunks it had verified: the origin serves
  exactly the rest (counted by the metric).
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.distribution.manifest import Manifest
from conveyor.distribution.push import push_model
from conveyor.fakes.checkpoints import build_tiny_llama
from conveyor.stores import open_job_store, open_object_store
from tests.integration.fleet.conftest import Fleet, Proc
from tests.integration.fleet.test_model_distribution import AS_GATEWAY, worker_config
from tests.polling import until

CHUNK_BYTES = 32 * 1024
SEED_UPLOAD_MB_S = "0.25"  # the ~0.6 MB model takes seconds to serve from the seed
STALE_AFTER_S = 5.0  # the puller's default: holds not touched for longer are ignored
NO_STALL_S = 15.0  # well under the 30 s a puller would wait on a hung peer


@pytest.fixture
def pushed(tmp_path: Path) -> Iterator[tuple[Fleet, Manifest]]:
    """A fleet on a SQLite store where `tiny` has been pushed in small chunks."""
    store_url, objects = f"sqlite://{tmp_path}/jobs.db", tmp_path / "objects"
    store = open_job_store(store_url)
    try:
        result = push_model(
            build_tiny_llama(tmp_path / "model"), "tiny", store, open_object_store(str(objects)),
            chunk_bytes=CHUNK_BYTES, now=1.0,
        )  # fmt: skip
    finally:
        store.close()
    fleet = Fleet(store_url, tmp_path)
    try:
        yield fleet, result.manifest
    finally:
        fleet.stop_all()


def spawn(fleet: Fleet, name: str, *extra: str) -> Proc:
    """Start a worker pulling `tiny` without waiting for it."""
    args = ("--objects", str(fleet.tmp / "objects"), *extra)
    return fleet.spawn_worker(name, config=worker_config(fleet.tmp, name), extra_args=args)


def seed(fleet: Fleet) -> Proc:
    """A ready worker holding the whole model, serving it at a capped rate."""
    proc = spawn(fleet, "seed", "--peer-upload-mb-s", SEED_UPLOAD_MB_S)
    fleet.wait_ready(proc)
    return proc


def held_chunks(fleet: Fleet, name: str) -> dict[str, int]:
    """The verified chunks in a worker's cache, with their sizes."""
    chunks = fleet.tmp / name / "model-cache" / "chunks"
    return {p.name: p.stat().st_size for p in chunks.glob("*")} if chunks.is_dir() else {}


def wait_for_chunks(fleet: Fleet, name: str, manifest: Manifest, at_least: int) -> None:
    """Wait until a worker has verified `at_least` chunks, and fail if it already has them all."""
    until(lambda: len(held_chunks(fleet, name)) >= at_least, f"{name}'s first chunks", timeout_s=30)
    assert len(held_chunks(fleet, name)) < len(manifest.unique_chunks()), "pull not cut short"


def has_every_chunk(fleet: Fleet, name: str, manifest: Manifest) -> bool:
    """Whether a worker has verified every chunk of the model."""
    return len(held_chunks(fleet, name)) == len(manifest.unique_chunks())


def sigkill(proc: Proc) -> None:
    """Kill a worker at once, as a crash would; its tracker rows stay behind."""
    proc.process.send_signal(signal.SIGKILL)
    proc.process.wait(timeout=10)


def fetched(proc: Proc, source: str) -> float:
    """Chunk bytes this worker fetched from `source` (origin|peer)."""
    return proc.metric("conveyor_model_fetch_bytes_total", source=source)


def completes(proc: Proc) -> bool:
    """Whether the pulled model answers a completion."""
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    answer = httpx.post(f"{proc.url}/v1/completions", json=body, headers=AS_GATEWAY, timeout=30)
    return answer.status_code == 200


def seed_holds_are_stale(fleet: Fleet) -> bool:
    """Whether every tracker row of the killed seed is older than the pullers' staleness."""
    store = open_job_store(fleet.store_url)
    try:
        rows = [
            r
            for r in store.chunk_holders(list(held_chunks(fleet, "seed")))
            if r.worker_id == "seed"
        ]
    finally:
        store.close()
    return bool(rows) and all(r.updated_at < time.time() - STALE_AFTER_S - 0.5 for r in rows)


def test_a_peer_killed_mid_transfer_does_not_stall_the_others(
    pushed: tuple[Fleet, Manifest],
) -> None:
    fleet, manifest = pushed
    first = seed(fleet)
    pullers = [spawn(fleet, "b"), spawn(fleet, "c")]
    wait_for_chunks(fleet, "b", manifest, at_least=2)
    sigkill(first)
    for proc in pullers:  # the pull itself is timed, not the model load that follows it
        pulled = functools.partial(has_every_chunk, fleet, proc.name, manifest)
        until(pulled, f"{proc.name} to finish its pull after the kill", timeout_s=NO_STALL_S)
    for proc in pullers:
        fleet.wait_ready(proc)
    assert sum(fetched(p, "origin") for p in pullers) > 0  # what only the seed had came again
    for proc in pullers:
        assert fetched(proc, "origin") + fetched(proc, "peer") == manifest.total_bytes
        assert completes(proc)
    # The dead seed's holds linger in the tracker; once stale, a newcomer does not ask it.
    until(lambda: seed_holds_are_stale(fleet), "the seed's holds to go stale", timeout_s=30)
    late = spawn(fleet, "late")
    fleet.wait_ready(late)
    assert fetched(late, "peer") == manifest.total_bytes
    assert "skipping peer seed" not in late.log()


def test_a_worker_joining_mid_distribution_finishes_from_peers(
    pushed: tuple[Fleet, Manifest],
) -> None:
    fleet, manifest = pushed
    seed(fleet)
    early = spawn(fleet, "early")
    wait_for_chunks(fleet, "early", manifest, at_least=2)
    joiner = spawn(fleet, "joiner")
    for proc in (early, joiner):
        fleet.wait_ready(proc)
        assert fetched(proc, "origin") == 0
        assert fetched(proc, "peer") == manifest.total_bytes
        assert completes(proc)


def test_a_worker_killed_mid_pull_resumes_with_its_verified_chunks(
    pushed: tuple[Fleet, Manifest],
) -> None:
    fleet, manifest = pushed
    first = seed(fleet)
    victim = spawn(fleet, "victim")
    wait_for_chunks(fleet, "victim", manifest, at_least=3)
    sigkill(victim)
    kept = held_chunks(fleet, "victim")
    first.process.send_signal(signal.SIGINT)  # no peer left: the rest must come from the origin
    first.process.wait(timeout=20)
    again = spawn(fleet, "victim")
    fleet.wait_ready(again)
    assert fetched(again, "origin") == manifest.total_bytes - sum(kept.values())
    assert fetched(again, "peer") == 0
    assert completes(again)
