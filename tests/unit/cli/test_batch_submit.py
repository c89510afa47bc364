"""``conveyor batch submit`` takes the endpoint from the file's lines, and refuses (before
uploading) a file that mixes urls or contradicts ``--endpoint``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conveyor.cli import batch as cli_batch
from conveyor.cli.batch import choose_endpoint, tally_urls
from conveyor.cli.main import app as cli_app

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"


def line(url: str, index: int = 0) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": f"r{index}", "method": "POST", "url": url, "body": body})


class RecordingClient:
    """Stands in for ``BatchClient``: records what would be uploaded and created."""

    calls: list[tuple[str, Any]] = []

    def __init__(self, url: str, api_key: str | None) -> None:
        pass

    def upload(self, path: Path) -> dict[str, Any]:
        self.calls.append(("upload", path.name))
        return {"id": "file-1"}

    def create(self, file_id: str, endpoint: str, window: str, metadata: Any) -> dict[str, Any]:
        self.calls.append(("create", endpoint))
        return {"id": "batch_1"}

    def close(self) -> None:
        pass


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> type[RecordingClient]:
    monkeypatch.setattr(cli_batch, "BatchClient", RecordingClient)
    RecordingClient.calls = []
    return RecordingClient


def submit(tmp_path: Path, lines: list[str], *flags: str) -> Any:
    file = tmp_path / "in.jsonl"
    file.write_text("\n".join(lines) + "\n")
    return CliRunner().invoke(cli_app, ["batch", "submit", str(file), *flags])


def test_the_endpoint_comes_from_the_lines(tmp_path: Path, client: type[RecordingClient]) -> None:
    done = submit(tmp_path, [line(CHAT, 0), "", line(CHAT, 1)])
    assert done.exit_code == 0, done.output
    assert client.calls == [("upload", "in.jsonl"), ("create", CHAT)]
    assert done.stdout.strip() == "batch_1"


def test_a_matching_endpoint_flag_is_used(tmp_path: Path, client: type[RecordingClient]) -> None:
    assert submit(tmp_path, [line(EMBEDDINGS)], "--endpoint", EMBEDDINGS).exit_code == 0
    assert client.calls[-1] == ("create", EMBEDDINGS)


@pytest.mark.parametrize(
    ("lines", "flags", "message"),
    [
        (
            [line(EMBEDDINGS, 0), line(CHAT, 1), line(CHAT, 2)],
            [],
            "the lines call several endpoints: /v1/embeddings (1 line from line 1), "
            "/v1/chat/completions (2 lines from line 2); a batch calls one, so split the file",
        ),
        (
            [line(CHAT, 0)],
            ["--endpoint", EMBEDDINGS],
            "--endpoint is /v1/embeddings but the lines call /v1/chat/completions (1 line from "
            "line 1): the server would refuse every line that differs",
        ),
        (["not json", "{}"], [], "no line names a url; give --endpoint"),
        ([line("/v1/moderations")], [], "batches call one of /v1/embeddings, "),
    ],
)
def test_what_the_server_would_refuse_is_refused_before_upload(
    tmp_path: Path,
    client: type[RecordingClient],
    lines: list[str],
    flags: list[str],
    message: str,
) -> None:
    refused = submit(tmp_path, lines, *flags)
    assert refused.exit_code == 2
    assert message in " ".join(refused.output.split())
    assert client.calls == []


def test_the_scan_reads_lines_one_at_a_time_and_bounds_what_it_remembers() -> None:
    lines = (line(f"/v1/u{index % 20}", index).encode() for index in range(1000))
    tally = tally_urls(lines)  # a generator: nothing needs the whole file at once
    assert len(tally.lines) == cli_batch.MAX_NAMED_URLS
    assert sum(count for count, _ in tally.lines.values()) + tally.unnamed == 1000
    assert tally.describe().endswith("600 more lines with other urls")
    with pytest.raises(ValueError, match="several endpoints"):
        choose_endpoint(tally, None)
