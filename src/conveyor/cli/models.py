"""`conveyor models push | list | rm`: pushed models in the job and object stores; and
`conveyor models import`: a GGUF file as a checkpoint directory (to serve or push).

`--store` and `--objects` name the fleet's shared stores (as for `conveyor worker`); without
them the defaults under the config's `data_dir` are used, as `conveyor serve` does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from conveyor.config.settings import load_config
from conveyor.distribution.manifest import MIB, check_model_name
from conveyor.distribution.push import push_model, remove_model
from conveyor.errors import ConfigError
from conveyor.stores import StoreError, open_job_store, open_object_store

models_app = typer.Typer(help="Models distributed as content-addressed chunks.")

StoreOption = Annotated[
    str | None, typer.Option("--store", envvar="CONVEYOR_STORE", help="Job store URL.")
]
ObjectsOption = Annotated[
    str | None, typer.Option("--objects", envvar="CONVEYOR_OBJECTS", help="Object store URL.")
]
ConfigOption = Annotated[Path | None, typer.Option(help="YAML config (for data_dir).")]


def _urls(store: str | None, objects: str | None, config: Path | None) -> tuple[str, str]:
    """The store URLs: the flags, else the config's jobs section, else under data_dir."""
    try:
        settings = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    jobs = settings.jobs
    return (
        store or jobs.job_store_url_for(settings.data_dir),
        objects or jobs.object_store_url_for(settings.data_dir),
    )


@models_app.command("push")
def push(
    directory: Annotated[Path, typer.Argument(help="Model directory (every file is pushed).")],
    name: Annotated[str, typer.Option("--name", help="Name entries use: conveyor://NAME.")],
    store: StoreOption = None,
    objects: ObjectsOption = None,
    config: ConfigOption = None,
    chunk_mb: Annotated[float, typer.Option(help="Chunk size in MiB.")] = 64,
) -> None:
    """Upload a model directory's new chunks and record its manifest under NAME."""
    chunk_bytes = int(chunk_mb * MIB)
    try:
        check_model_name(name)
        if chunk_bytes < 1:
            raise ValueError(f"--chunk-mb must be > 0, got {chunk_mb}")
        store_url, objects_url = _urls(store, objects, config)
        job_store = open_job_store(store_url)
        try:
            result = push_model(
                directory, name, job_store, open_object_store(objects_url),
                chunk_bytes=chunk_bytes, now=time.time(),
            )  # fmt: skip
        finally:
            job_store.close()
    except (ValueError, StoreError, OSError) as exc:
        typer.echo(f"push failed: {exc}", err=True)
        raise typer.Exit(code=1) from None
    manifest = result.manifest
    typer.echo(
        f"{name}: {len(manifest.files)} files, {manifest.total_bytes} bytes, "
        f"{result.num_uploaded} chunks uploaded ({result.uploaded_bytes} bytes), "
        f"{result.num_reused} already stored; digest {manifest.digest}"
    )


@models_app.command("list")
def list_models(
    store: StoreOption = None, objects: ObjectsOption = None, config: ConfigOption = None
) -> None:
    """Print every pushed model: name, size, digest, when it was pushed."""
    job_store = open_job_store(_urls(store, objects, config)[0])
    try:
        records = job_store.list_manifests()
    finally:
        job_store.close()
    for rec in records:
        pushed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.created_at))
        typer.echo(f"{rec.name}\t{rec.total_bytes}\t{rec.digest}\t{pushed}")


@models_app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="Model name.")],
    store: StoreOption = None,
    objects: ObjectsOption = None,
    config: ConfigOption = None,
) -> None:
    """Forget a pushed model and delete the chunks no other model uses."""
    store_url, objects_url = _urls(store, objects, config)
    job_store = open_job_store(store_url)
    try:
        deleted = remove_model(name, job_store, open_object_store(objects_url))
    finally:
        job_store.close()
    if deleted is None:
        typer.echo(f"no model named {name!r}", err=True)
        raise typer.Exit(code=1)
    typer.echo(f"{name}: removed, {deleted} chunks deleted")


@models_app.command("import")
def import_command(
    source: Annotated[Path, typer.Argument(help="A .gguf file (or a directory holding one).")],
    out_dir: Annotated[Path, typer.Argument(help="Directory to write (new or empty).")],
    dtype: Annotated[str, typer.Option(help="float32 (exact), float16 or bfloat16.")] = "float32",
) -> None:
    """Write a GGUF file as safetensors weights, tokenizer and config.json in OUT_DIR."""
    from conveyor.engine.model.gguf_import import import_gguf

    try:
        result = import_gguf(source, out_dir, dtype=dtype)
    except (ValueError, OSError) as exc:
        typer.echo(f"import failed: {exc}", err=True)
        raise typer.Exit(code=1) from None
    files = len(result.weight_files)
    typer.echo(
        f"{result.directory}: {result.num_params} parameters in {files} safetensors "
        f"file{'' if files == 1 else 's'} ({result.weight_bytes} bytes, {dtype}), "
        "tokenizer and config"
    )
