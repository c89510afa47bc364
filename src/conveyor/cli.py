"""The ``conveyor`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from conveyor.config import ServerConfig, load_config
from conveyor.errors import ConfigError

app = typer.Typer(help="Conveyor: batched inference behind an OpenAI-compatible API.")


def _load_or_exit(config: Path | None, **overrides: object) -> ServerConfig:
    try:
        return load_config(config, overrides=overrides)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None


@app.callback()
def main() -> None:
    """Conveyor: batched inference behind an OpenAI-compatible API."""


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0 = any free).")] = None,
) -> None:
    """Run the whole service in one process (default model: all-MiniLM-L6-v2)."""
    import uvicorn

    from conveyor.api.app import create_app

    settings = _load_or_exit(config, host=host, port=port)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


@app.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="YAML config file.")]) -> None:
    """Validate a config file and print the models it defines."""
    settings = _load_or_exit(config)
    for model in settings.models:
        typer.echo(f"{model.name}: {model.kind}")
