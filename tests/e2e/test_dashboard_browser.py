"""The dashboard in a real browser: headless Chromium (Debian's package) via Playwright.

A server runs under a little load; the page must show the model's name and non-zero
throughput in its charts, the plan beside the measured figures, the limits the tenant hit
and the (empty) model pulls, with no console error. The screenshot is saved (set
CONVEYOR_DASHBOARD_SCREENSHOT to a path to keep it, e.g. docs/dashboard.png).
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
