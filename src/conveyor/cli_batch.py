"""`conveyor batch ...`: submit, watch, inspect, cancel and download batch jobs over HTTP.

The commands talk to a running server's OpenAI-compatible Files and Batches API, so they
work against any deployment: `--url` (default http://127.0.0.1:8000) and `--api-key` (or
CONVEYOR_API_KEY).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
MAX_PRINTED_ERRORS = 100
TIMEOUT_S = 60.0

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


@batch_app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL input.")],
    endpoint: Annotated[str, typer.Option(help="Endpoint every line calls.")] = "/v1/embeddings",
    completion_window: Annotated[str, typer.Option(help="e.g. 24h, 1h.")] = "24h",
    metadata: Annotated[list[str] | None, typer.Option(help="key=value (repeatable).")] = None,
    watch: Annotated[bool, typer.Option(help="Follow progress until the batch ends.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Upload FILE and start a batch over it; print the batch id."""
    with _client(url, api_key) as client:
        uploaded = client.upload(file)
        batch = client.create(
            uploaded["id"], endpoint, completion_window, _parse_metadata(metadata or [])
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
