"""The ``conveyor`` command line."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from starlette.types import ASGIApp

from conveyor.cli_batch import batch_app
from conveyor.cli_keys import keys_app
from conveyor.cli_usage import usage_command
from conveyor.config import ServerConfig, load_config
from conveyor.errors import ConfigError

if TYPE_CHECKING:
    from conveyor.gateway import GatewaySettings

app = typer.Typer(help="Conveyor: batched inference behind an OpenAI-compatible API.")
app.add_typer(batch_app, name="batch")
app.add_typer(keys_app, name="keys")
app.command("usage")(usage_command)


def _load_or_exit(config: Path | None, **overrides: object) -> ServerConfig:
    try:
        return load_config(config, overrides=overrides)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None


# Connection limits every serving command takes (None: the config file's value).
MaxConnections = Annotated[
    int | None, typer.Option(help="Open connections per process; beyond it: 503.")
]
HeaderTimeoutS = Annotated[
    float | None, typer.Option(help="Seconds a client may take to send a request head.")
]
BodyTimeoutS = Annotated[
    float | None, typer.Option(help="Seconds a request body may stall between chunks.")
]


def _run_uvicorn(
    asgi_app: ASGIApp, settings: ServerConfig, sockets: list[socket.socket] | None = None
) -> None:
    """Serve ``asgi_app`` on the configured address (or ``sockets``) until SIGINT or SIGTERM."""
    import uvicorn

    from conveyor.api.server import uvicorn_config

    config = uvicorn_config(
        asgi_app, settings, host=settings.host, port=settings.port, loop="uvloop",
        timeout_graceful_shutdown=10,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.run(sockets=sockets)
    if not server.started:  # as uvicorn.run: a failed start-up (port in use) exits non-zero
        raise typer.Exit(code=3)


@app.callback()
def main() -> None:
    """Conveyor: batched inference behind an OpenAI-compatible API."""


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0 = any free).")] = None,
    max_connections: MaxConnections = None,
    header_timeout_s: HeaderTimeoutS = None,
    body_timeout_s: BodyTimeoutS = None,
) -> None:
    """Run the whole service in one process (default model: all-MiniLM-L6-v2)."""
    from conveyor.api.app import create_app

    settings = _load_or_exit(
        config, host=host, port=port, max_connections=max_connections,
        header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
    )  # fmt: skip
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    key_store_url = settings.jobs.job_store_url_for(settings.data_dir)
    _run_uvicorn(create_app(settings, key_store_url=key_store_url), settings)


# The shared-state options every fleet process takes.
StoreUrl = Annotated[
    str, typer.Option(envvar="CONVEYOR_STORE", help="Job store URL (PostgreSQL for a fleet).")
]
ObjectsUrl = Annotated[
    str | None, typer.Option(envvar="CONVEYOR_OBJECTS", help="Object store URL.")
]


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def worker(
    store: StoreUrl,
    config: Annotated[Path | None, typer.Option(help="YAML config file (models).")] = None,
    objects: ObjectsUrl = None,
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on.")] = "127.0.0.1:8001",
    advertise: Annotated[
        str | None, typer.Option(envvar="CONVEYOR_ADVERTISE", help="URL gateways use.")
    ] = None,
    worker_id: Annotated[str | None, typer.Option(help="Registry id (default: random).")] = None,
    heartbeat_s: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 1.0,
    drain_timeout_s: Annotated[float, typer.Option(help="Longest SIGTERM drain.")] = 30.0,
    max_connections: MaxConnections = None,
    header_timeout_s: HeaderTimeoutS = None,
    body_timeout_s: BodyTimeoutS = None,
) -> None:
    """Host the configured models and join the fleet through the store's worker registry."""
    from conveyor.worker import WorkerSettings, parse_listen, run_worker

    settings = _load_or_exit(
        config, max_connections=max_connections, header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )  # fmt: skip
    try:
        host, port = parse_listen(listen)
        worker_settings = WorkerSettings(
            store_url=store, objects_url=objects, host=host, port=port, advertise=advertise,
            worker_id=worker_id, heartbeat_s=heartbeat_s, drain_timeout_s=drain_timeout_s,
        )  # fmt: skip
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    _configure_logging(settings.log_level)
    run_worker(settings, worker_settings)


@app.command()
def gateway(
    store: StoreUrl,
    config: Annotated[Path | None, typer.Option(help="YAML config file (API keys).")] = None,
    objects: ObjectsUrl = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0 = any free).")] = None,
    stale_after_s: Annotated[float, typer.Option(help="Heartbeat age that is stale.")] = 3.0,
    refresh_s: Annotated[float, typer.Option(help="Seconds between registry reads.")] = 0.25,
    max_attempts: Annotated[int, typer.Option(help="Workers tried per request.")] = 3,
    target_utilisation: Annotated[float, typer.Option(help="For desired replicas.")] = 0.7,
    processes: Annotated[
        int, typer.Option(min=1, help="Processes sharing the port (SO_REUSEPORT), one per core.")
    ] = 1,
    max_connections: MaxConnections = None,
    header_timeout_s: HeaderTimeoutS = None,
    body_timeout_s: BodyTimeoutS = None,
) -> None:
    """Route online requests to the fleet's workers; holds no model."""
    from conveyor.api.gateway_app import create_gateway_app
    from conveyor.gateway import GatewaySettings

    settings = _load_or_exit(
        config, host=host, port=port, max_connections=max_connections,
        header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
    )  # fmt: skip
    try:
        gateway_settings = GatewaySettings(
            store_url=store, objects_url=objects, stale_after_s=stale_after_s,
            reap_after_s=max(60.0, 20 * stale_after_s), refresh_s=refresh_s,
            max_attempts=max_attempts, target_utilisation=target_utilisation,
        )  # fmt: skip
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    _configure_logging(settings.log_level)
    if processes == 1:
        _run_uvicorn(create_gateway_app(gateway_settings, settings), settings)
        return
    _run_gateway_processes(gateway_settings, settings, processes)


def _run_gateway_processes(
    gateway_settings: GatewaySettings, settings: ServerConfig, num_processes: int
) -> None:
    """``--processes N``: N gateway processes on one port; exits non-zero if one cannot start."""
    from conveyor.api.server_processes import reuse_port_socket, run_processes

    # Bound, never listening: fixes the port (``--port 0``) for every process to share.
    with reuse_port_socket(settings.host, settings.port) as reservation:
        port = int(reservation.getsockname()[1])
        logging.getLogger(__name__).info(
            "gateway: %d processes on %s:%d", num_processes, settings.host, port
        )
        exit_code = run_processes(
            _gateway_process, (gateway_settings, settings, port), num_processes
        )
    if exit_code:
        raise typer.Exit(code=exit_code)


def _gateway_process(gateway_settings: GatewaySettings, settings: ServerConfig, port: int) -> None:
    """One of the gateway's processes: its own app, event loop and socket on ``port``."""
    from conveyor.api.gateway_app import create_gateway_app
    from conveyor.api.server_processes import reuse_port_socket

    _configure_logging(settings.log_level)
    sock = reuse_port_socket(settings.host, port)
    _run_uvicorn(create_gateway_app(gateway_settings, settings), settings, sockets=[sock])


@app.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="YAML config file.")]) -> None:
    """Validate a config file and print the models it defines."""
    settings = _load_or_exit(config)
    for model in settings.models:
        typer.echo(f"{model.name}: {model.kind}")
