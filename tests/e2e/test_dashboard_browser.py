"""The dashboard in a real browser: headless Chromium (Debian's package) via Playwright.

A server runs under a little online load while a batch job runs; the page must show the
model's name and non-zero throughput in its charts, online and batch-job latency apart
(figures and charts of their own), value axes wide enough for every tick label (checked on
the live charts and on one fed latencies of 0 to 50,000 ms), the plan beside the measured
figures saying which plan it is and when it was made, the limits the tenant hit and the
(empty) model pulls, with no console error. The screenshot is kept for review as
``bench/results/dashboard.png`` (CONVEYOR_DASHBOARD_SCREENSHOT names another path). A
stalled batch's row says since when and why.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
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
# A slow model a batch job keeps busy beside a trickle of online requests: the job's lines
# wait seconds behind each other, online requests go first (tens of thousands of ms and a
# few hundred on one card).
SLOW = {"name": "slow", "kind": "synthetic", "max_batch_size": 8, "max_wait_ms": 5,
        "batch_latency_ms": 100, "dim": 4}  # fmt: skip
TENANTS = [{"name": "default", "limits": {"capped": {"rpm": 3}}}]
SHOWN_TIMEOUT_MS = 30_000
SCREENSHOT = Path(__file__).resolve().parents[2] / "bench" / "results" / "dashboard.png"
BATCH_LINES = 3000
# Every value axis, live or fed large latencies: its labels and whether each fits its width.
AXES_JS = """() => window.conveyorCharts.map(({ title, plot }) => {
    const axis = plot.axes[1];
    plot.ctx.font = axis.font[0];
    const room = axis._size - axis.ticks.size - axis.gap;
    const labels = axis._values || [];
    const widths = labels.map((l) => plot.ctx.measureText(l).width / devicePixelRatio);
    return { title, labels, fits: widths.every((w) => w <= room) };
})"""
BIG_LATENCIES_JS = """() => {
    const box = document.createElement('div');
    document.body.append(box);
    const plot = chart({ title: 'fed 0 to 50,000 ms', series: ['p99'] }, box);
    const now = Date.now() / 1000;
    plot.setData([[now - 4, now - 2, now], [0, 25000, 50000]]);
}"""


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
def loaded_server(
    server_factory: Callable[[dict[str, Any]], Server], tmp_path: Path
) -> Iterator[Server]:
    """A server with a caller sending small requests until the test ends."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    tiny = {"name": "tiny", "kind": "generate", "path": str(build_tiny_llama(tmp_path / "tiny")),
            "device": "cpu", "kv_cache_tokens": 1024, "max_num_seqs": 4, "threads": 1}  # fmt: skip
    server = server_factory({"models": [SYN, CAPPED, SLOW, tiny], "tenants": TENANTS})
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for i in itertools.count():
                if stop.wait(0.02):
                    break
                client.post("/v1/embeddings", json={"model": "syn", "input": ["a", "b"]})
                if i % 10 == 0:
                    client.post("/v1/embeddings", json={"model": "capped", "input": "c"})
                if i % 5 == 0:
                    client.post("/v1/embeddings", json={"model": "slow", "input": "s"})
                if i % 25 == 0:
                    client.post("/v1/completions", json={"model": "tiny", "prompt": "t",
                                                         "max_tokens": 4})  # fmt: skip

    caller = threading.Thread(target=load, name="dashboard-load", daemon=True)
    caller.start()
    start_batch_job(server)
    yield server
    stop.set()
    caller.join(timeout=10)


def start_batch_job(server: Server) -> None:
    """A batch job of embedding lines on the slow model: its lines wait behind online
    requests and each other, so their latency is a series apart."""
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)

    def line(i: int) -> str:
        body = {"model": "slow", "input": f"line {i}"}
        return json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                           "body": body})  # fmt: skip

    lines = "".join(line(i) + "\n" for i in range(BATCH_LINES))
    upload = client.files.create(file=("lines.jsonl", lines.encode()), purpose="batch")
    client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )


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
        check_latency_apart(page)
        check_the_plan_says_which_it_is(page)
        check_axis_labels_are_whole(page)
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == []
    assert shot.stat().st_size > 10_000
    keep = Path(os.environ.get("CONVEYOR_DASHBOARD_SCREENSHOT") or SCREENSHOT)
    keep.parent.mkdir(parents=True, exist_ok=True)
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


def check_latency_apart(page: Any) -> None:
    """Online and batch-job latency of one model: figures and charts of their own, both
    measured, the job's lines (waiting behind each other) far slower."""
    page.wait_for_function(
        """() => {
            const card = document.querySelector('[data-model="slow"]');
            if (!card) return false;
            const stat = (key) => parseFloat(card.querySelector(`[data-stat="${key}"]`)
                .textContent.replaceAll(',', ''));
            return stat('p99') > 0 && stat('batch_p99') > 5 * stat('p99');
        }""",
        timeout=SHOWN_TIMEOUT_MS,
    )
    card = page.locator('[data-model="slow"]')
    titles = card.locator(".chart").evaluate_all("boxes => boxes.map((b) => b.dataset.chart)")
    assert "online latency ms" in titles and "batch-job latency ms" in titles
    stats = card.locator(".stats").inner_text()
    assert "online p99 ms" in stats and "batch-job p99 ms" in stats


def check_the_plan_says_which_it_is(page: Any) -> None:
    """The plan panel names its kind and when it was made; a preset's says it is nominal."""
    plan = page.locator('[data-model="syn"] table.plan')
    assert plan.get_attribute("data-plan-kind") == "calibrated"
    assert float(plan.get_attribute("data-planned-at") or 0) > 0
    header = plan.locator("th").first.inner_text()
    assert header.startswith("plan (calibrated: measured batch-time curve), made ")
    preset = page.locator('[data-model="tiny"] table.plan')
    assert preset.get_attribute("data-plan-kind") == "preset"
    shown = preset.inner_text()
    assert "plan (preset cpu from config.json, nominal, not measured), made " in shown
    assert "--calibrate" in shown  # the note says how to get a measured plan


def check_axis_labels_are_whole(page: Any) -> None:
    """Every value axis is as wide as its widest tick label, large latencies included."""
    page.evaluate(BIG_LATENCIES_JS)
    axes = page.evaluate(AXES_JS)
    assert len(axes) >= 21, axes  # five charts on each model's card, and the one fed here
    assert all(axis["fits"] for axis in axes), axes
    (fed,) = [axis for axis in axes if axis["title"] == "fed 0 to 50,000 ms"]
    assert "50,000" in fed["labels"] or "40,000" in fed["labels"], fed
