"""The dashboard in a real browser: headless Chromium (Debian's package) via Playwright.

A server runs under a little load; the page must show the model's name and non-zero
throughput in its charts, the plan beside the measured figures, the limits the tenant hit
and the (empty) model pulls, with no console error. The screenshot is saved (set
CONVEYOR_DASHBOARD_SCREENSHOT to a path to keep it, e.g. docs/dashboard.png). A stalled
batch's row says since when and why.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.dashboard.state import job_row
from conveyor.stores.records import BatchError, BatchRecord, BatchStatus
from tests.e2e.conftest import Server
from tests.missing import missing

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
SYN = {"name": "syn", "kind": "synthetic", "max_batch_size": 16, "max_wait_ms": 5,
       "batch_latency_ms": 10, "dim": 4}  # fmt: skip
# A second model the tenant may call 3 times a minute: the load hits that limit.
CAPPED = {"name": "capped", "kind": "synthetic", "batch_latency_ms": 1, "dim": 4}
TENANTS = [{"name": "default", "limits": {"capped": {"rpm": 3}}}]
SHOWN_TIMEOUT_MS = 30_000


def _browser_or_skip() -> Any:
    """Playwright's sync API, or a skip (a failure under CI=true) when it is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not Path(CHROMIUM).exists():
        missing("Playwright or /usr/bin/chromium is missing (.ci/run installs them)")
    return sync_playwright


@pytest.fixture
def loaded_server(server_factory: Callable[[dict[str, Any]], Server]) -> Iterator[Server]:
    """A server with a caller sending small requests until the test ends."""
    server = server_factory({"models": [SYN, CAPPED], "tenants": TENANTS})
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for i in itertools.count():
                if stop.wait(0.02):
                    break
                client.post("/v1/embeddings", json={"model": "syn", "input": ["a", "b"]})
                if i % 10 == 0:
                    client.post("/v1/embeddings", json={"model": "capped", "input": "c"})

    caller = threading.Thread(target=load, name="dashboard-load", daemon=True)
    caller.start()
    yield server
    stop.set()
    caller.join(timeout=10)


def test_the_dashboard_charts_live_throughput(loaded_server: Server, tmp_path: Path) -> None:
    sync_playwright = _browser_or_skip()
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{loaded_server.url}/dashboard")
        page.wait_for_function(
            """() => {
                const card = document.querySelector('[data-model="syn"]');
                if (!card || card.querySelector('.model-name').textContent !== 'syn') return false;
                const shown = parseFloat(card.querySelector('[data-stat="throughput"]').textContent);
                const points = parseInt(card.dataset.points || '0', 10);
                return shown > 0 && points >= 3 && card.querySelectorAll('canvas').length >= 4;
            }""",
            timeout=SHOWN_TIMEOUT_MS,
        )
        # The plan from the measured batch times, beside the measured figures.
        page.wait_for_function(
            """() => {
                const plan = document.querySelector('[data-model="syn"] table.plan');
                if (!plan || plan.dataset.source !== 'measured batch-time curve') return false;
                const cells = [...plan.querySelectorAll('tr')].map((r) => r.children[1].textContent);
                return cells.length >= 3 && parseFloat(cells[1]) > 0;
            }""",
            timeout=SHOWN_TIMEOUT_MS,
        )
        # The tenant's 429s on the capped model, counted under its rpm limit.
        page.wait_for_function(
            """() => {
                const rows = [...document.querySelectorAll('#limits tr')].slice(1);
                const row = rows.find((r) => r.children[0].textContent === 'default');
                return row && parseInt(row.children[2].textContent, 10) > 0;
            }""",
            timeout=SHOWN_TIMEOUT_MS,
        )
        assert page.is_visible("#pulls-section")
        assert "no model pull running" in page.inner_text("#pulls")
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == []
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("CONVEYOR_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


def stalled_row(since: int) -> dict[str, Any]:
    """The dashboard state's row of a batch whose shard outputs cannot be written."""
    note = BatchError(
        "object_store_unavailable",
        "the object store is full (No space left on device); the batch resumes once it has room",
        since=since,
    )
    record = BatchRecord("batch_stalled", "default", "/v1/embeddings", "file-in", "24h",
                         created_at=since - 60, status=BatchStatus.IN_PROGRESS, model="syn",
                         errors=[note])  # fmt: skip
    return job_row(record)


def test_a_stalled_batch_shows_since_when_and_why(
    server_factory: Callable[[dict[str, Any]], Server],
) -> None:
    """The page renders the stall note a job row carries; that the state carries it while
    a disk is full is tests/integration/jobs/test_full_disk.py's part."""
    sync_playwright = _browser_or_skip()
    server = server_factory({"models": [SYN]})
    row = stalled_row(since=1_700_000_000)
    errors: list[str] = []

    def with_the_stalled_batch(route: Any) -> None:
        answer = route.fetch()
        state = answer.json()
        state["jobs"] = [*(state["jobs"] or []), row]
        route.fulfill(response=answer, json=state)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.route("**/v1/dashboard/state", with_the_stalled_batch)
        page.goto(f"{server.url}/dashboard")
        status = page.locator("#jobs tr", has_text="batch_stalled").locator("td").nth(1)
        status.locator("span.bad").wait_for(timeout=SHOWN_TIMEOUT_MS)
        shown_since = page.evaluate("(s) => new Date(s * 1000).toLocaleTimeString()", 1_700_000_000)
        text = status.inner_text()
        assert text == f"in_progress, stalled since {shown_since}: {row['stall']['message']}"
        assert status.locator("span.bad").get_attribute("title") == row["stall"]["message"]
        browser.close()
    assert errors == []
