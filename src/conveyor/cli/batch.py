"""`conveyor batch ...`: submit, watch, inspect, cancel and download batch jobs over HTTP.

The commands talk to a running server's OpenAI-compatible Files and Batches API, so they
work against any deployment: `--url` (default http://127.0.0.1:8000) and `--api-key` (or
CONVEYOR_API_KEY).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from conveyor.openai_paths import BATCH_ENDPOINTS

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
MAX_PRINTED_ERRORS = 100
TIMEOUT_S = 60.0
# Distinct urls remembered while scanning a file (more only make the refusal longer).
MAX_NAMED_URLS = 8

batch_app = typer.Typer(help="Batch jobs on a running server (OpenAI's Batch API).")
console = Console(stderr=True)

UrlOption = Annotated[str, typer.Option("--url", envvar="CONVEYOR_URL", help="Server URL.")]
KeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="CONVEYOR_API_KEY", help="API key.")
]
IdArgument = Annotated[str, typer.Argument(help="Batch id (batch_...).")]


class ApiError(Exception):
    """The server answered with an error body."""


class BatchClient:
    """A small client for the Files and Batches endpoints."""

    def __init__(self, url: str, api_key: str | None) -> None:
        """Talk to the server at `url`, authenticating with `api_key` when given."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=TIMEOUT_S)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        """The decoded body of a successful response; ApiError otherwise."""
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise ApiError(f"{response.status_code}: {message}")
        body: dict[str, Any] = response.json()
        return body

    def upload(self, path: Path) -> dict[str, Any]:
        """Upload a JSONL file with purpose `batch` (streamed from disk)."""
        with path.open("rb") as handle:
            files = {"file": (path.name, handle, "application/jsonl")}
            return self._json(self._http.post("/v1/files", data={"purpose": "batch"}, files=files))

    def create(
        self, file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None
    ) -> dict[str, Any]:
        """Create a batch over an uploaded file."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        if metadata:
            body["metadata"] = metadata  # type: ignore[assignment]
        return self._json(self._http.post("/v1/batches", json=body))

    def get(self, batch_id: str) -> dict[str, Any]:
        """One batch."""
        return self._json(self._http.get(f"/v1/batches/{batch_id}"))

    def list(self, limit: int, after: str | None) -> dict[str, Any]:
        """A page of batches."""
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self._json(self._http.get("/v1/batches", params=params))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Ask the server to cancel a batch."""
        return self._json(self._http.post(f"/v1/batches/{batch_id}/cancel"))

    def download(self, file_id: str, out: Path) -> int:
        """Stream a file's content to `out`; return the number of bytes written."""
        num_bytes = 0
        with self._http.stream("GET", f"/v1/files/{file_id}/content") as response:
            if response.status_code >= 400:
                response.read()
                self._json(response)
            with out.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
                    num_bytes += len(chunk)
        return num_bytes


@contextmanager
def _client(url: str, api_key: str | None) -> Iterator[BatchClient]:
    """A client; API and connection errors end the command with exit code 1."""
    client = BatchClient(url, api_key)
    try:
        yield client
    except ApiError as exc:
        console.print(f"[red]error[/red] {exc}")
        raise typer.Exit(code=1) from None
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach {url}[/red]: {exc}")
        raise typer.Exit(code=1) from None
    finally:
        client.close()


def _parse_metadata(pairs: list[str]) -> dict[str, str] | None:
    """`key=value` options as a dict."""
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"metadata must be key=value, got {pair!r}")
        metadata[key] = value
    return metadata or None


def _summary(batch: dict[str, Any]) -> str:
    """One line: id, status and counts."""
    counts = batch.get("request_counts") or {}
    return (
        f"{batch['id']}  {batch['status']}  total={counts.get('total', 0)} "
        f"completed={counts.get('completed', 0)} failed={counts.get('failed', 0)}"
    )


def watch_batch(client: BatchClient, batch_id: str, interval_s: float) -> dict[str, Any]:
    """Poll until the batch finishes, drawing counts, rate and ETA; return its last state."""
    columns = (
        TextColumn("[bold]{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TextColumn("{task.fields[rate]} lines/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("batch", total=None, status="validating", failed=0, rate="-")
        started = time.monotonic()
        while True:
            batch = client.get(batch_id)
            counts = batch.get("request_counts") or {}
            done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
            elapsed_s = max(1e-9, time.monotonic() - started)
            progress.update(
                task, total=int(counts.get("total", 0)) or None, completed=done,
                status=batch["status"], failed=counts.get("failed", 0),
                rate=f"{done / elapsed_s:.0f}",
            )  # fmt: skip
            if batch["status"] in TERMINAL_STATUSES:
                return batch
            time.sleep(interval_s)


def error_lines(batch: dict[str, Any], limit: int = MAX_PRINTED_ERRORS) -> list[str]:
    """The batch's errors, one line each, at most ``limit`` and then how many more."""
    errors = batch.get("errors") or {}
    data = errors.get("data") or []
    total = int(errors.get("total_errors") or len(data))
    lines = []
    for error in data[:limit]:
        where = f"line {error['line']}: " if error.get("line") is not None else ""
        lines.append(f"  {where}{error.get('code')}: {error.get('message')}")
    if total > len(lines):
        lines.append(f"  ... and {total - len(lines)} more errors")
    return lines


def _exit_for(batch: dict[str, Any]) -> None:
    """Exit code 0 for a completed batch, 1 for any other end."""
    console.print(_summary(batch))
    for line in error_lines(batch):
        console.print(line, markup=False)
    if batch["status"] != "completed":
        raise typer.Exit(code=1)


class UrlTally:
    """The ``url`` each line of a batch file names: how many lines, and the first (1-based).

    Lines that are blank, not JSON objects or without a string url are not counted: the
    server lists them when it validates the file.
    """

    def __init__(self) -> None:
        self.lines: dict[str, list[int]] = {}  # url -> [count, first line]
        self.unnamed = 0  # lines whose url was past the first MAX_NAMED_URLS distinct ones

    def add(self, line_no: int, raw: bytes) -> None:
        """Count the url of line ``line_no`` (1-based)."""
        if not raw.strip():
            return
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        url = data.get("url") if isinstance(data, dict) else None
        if not isinstance(url, str):
            return
        if url in self.lines:
            self.lines[url][0] += 1
        elif len(self.lines) < MAX_NAMED_URLS:
            self.lines[url] = [1, line_no]
        else:
            self.unnamed += 1

    def describe(self) -> str:
        """``/v1/embeddings (3 lines from line 1), ...``."""
        parts = [f"{url} ({count} line{'s' * (count != 1)} from line {first})"
                 for url, (count, first) in self.lines.items()]  # fmt: skip
        if self.unnamed:
            parts.append(f"{self.unnamed} more lines with other urls")
        return ", ".join(parts)


def tally_urls(lines: Iterable[bytes]) -> UrlTally:
    """The urls of every line, read one line at a time."""
    tally = UrlTally()
    for line_no, raw in enumerate(lines, start=1):
        tally.add(line_no, raw)
    return tally


def choose_endpoint(tally: UrlTally, endpoint: str | None) -> str:
    """The endpoint the batch calls: ``endpoint`` if given, else the one url of every line.

    ValueError, before anything is uploaded, for what the server would refuse: lines that
    mix urls, lines whose url is not ``endpoint``, an endpoint batches do not support.
    """
    urls = list(tally.lines)
    mixed = len(urls) > 1 or tally.unnamed > 0
    if mixed and endpoint is None:
        raise ValueError(f"the lines call several endpoints: {tally.describe()}; a batch calls "
                         "one, so split the file")  # fmt: skip
    if endpoint is not None and (mixed or urls not in ([], [endpoint])):
        raise ValueError(f"--endpoint is {endpoint} but the lines call {tally.describe()}: "
                         "the server would refuse every line that differs")  # fmt: skip
    chosen = endpoint or (urls[0] if urls else None)
    if chosen is None:
        raise ValueError("no line names a url; give --endpoint")
    if chosen not in BATCH_ENDPOINTS:
        raise ValueError(f"batches call one of {', '.join(BATCH_ENDPOINTS)}, not {chosen}")
    return chosen


def _file_endpoint(file: Path, endpoint: str | None) -> str:
    """``choose_endpoint`` for a file on disk, or exit 2 with the reason."""
    with file.open("rb") as handle:
        tally = tally_urls(handle)
    try:
        return choose_endpoint(tally, endpoint)
    except ValueError as exc:
        console.print(f"[red]error[/red] {escape(f'{file}: {exc}')}", highlight=False)
        raise typer.Exit(code=2) from None


@batch_app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL input.")],
    endpoint: Annotated[
        str | None, typer.Option(help="Endpoint every line calls (default: the lines' url).")
    ] = None,
    completion_window: Annotated[str, typer.Option(help="e.g. 24h, 1h.")] = "24h",
    metadata: Annotated[list[str] | None, typer.Option(help="key=value (repeatable).")] = None,
    watch: Annotated[bool, typer.Option(help="Follow progress until the batch ends.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Upload FILE and start a batch over it; print the batch id.

    The endpoint is the one url every line names; lines mixing urls, or naming another
    than ``--endpoint``, are refused before anything is uploaded.
    """
    chosen = _file_endpoint(file, endpoint)
    with _client(url, api_key) as client:
        uploaded = client.upload(file)
        batch = client.create(
            uploaded["id"], chosen, completion_window, _parse_metadata(metadata or [])
        )
        typer.echo(batch["id"])
        if watch:
            _exit_for(watch_batch(client, batch["id"], interval))


@batch_app.command()
def status(
    batch_id: IdArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print the batch object.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Show a batch's status and request counts."""
    with _client(url, api_key) as client:
        batch = client.get(batch_id)
    typer.echo(json.dumps(batch, indent=2) if as_json else _summary(batch))


@batch_app.command("list")
def list_batches(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    after: Annotated[str | None, typer.Option(help="Batch id to continue after.")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """List batches, newest first."""
    with _client(url, api_key) as client:
        page = client.list(limit, after)
    columns = ("id", "status", "endpoint", "total", "completed", "failed", "created")
    rows = [_list_row(batch) for batch in page["data"]]
    out = Console()
    if not out.is_terminal:  # piped: plain tab-separated lines, whole ids, a header first
        for row in [columns, *rows]:
            typer.echo("\t".join(row))
        return
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def _list_row(batch: dict[str, Any]) -> tuple[str, ...]:
    """One batch as the columns of `list`."""
    counts = batch.get("request_counts") or {}
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch["created_at"]))
    return (
        batch["id"], batch["status"], batch["endpoint"], str(counts.get("total", 0)),
        str(counts.get("completed", 0)), str(counts.get("failed", 0)), created,
    )  # fmt: skip


@batch_app.command()
def cancel(batch_id: IdArgument, url: UrlOption = DEFAULT_URL, api_key: KeyOption = None) -> None:
    """Cancel a batch (finished lines are kept)."""
    with _client(url, api_key) as client:
        typer.echo(_summary(client.cancel(batch_id)))


@batch_app.command()
def results(
    batch_id: IdArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write outputs.")],
    errors: Annotated[Path | None, typer.Option(help="Where to write the error file.")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Download a finished batch's output file (and, with --errors, its error file)."""
    with _client(url, api_key) as client:
        batch = client.get(batch_id)
        if batch["status"] not in TERMINAL_STATUSES:
            console.print(f"batch {batch_id} is still {batch['status']}")
            raise typer.Exit(code=1)
        wanted = [(batch.get("output_file_id"), output, "output")]
        if errors is not None:
            wanted.append((batch.get("error_file_id"), errors, "errors"))
        for file_id, path, kind in wanted:
            if file_id is None and kind == "errors":
                console.print("errors: none (no error file written)")
                continue
            if file_id is None:
                path.write_bytes(b"")  # no output records: an empty file, not a stale one
                console.print(f"{kind}: none")
                continue
            console.print(f"{kind}: {client.download(file_id, path)} bytes -> {path}")
