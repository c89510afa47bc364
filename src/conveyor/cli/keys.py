"""`conveyor keys ...`: create, list and revoke the API keys kept in the job store.

The store is the one the serving processes read: `serve`'s SQLite under `--data-dir`, or a
fleet's PostgreSQL given by `--store` (or CONVEYOR_STORE). A new key is printed once; only
its SHA-256 is stored, so it cannot be shown again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from conveyor.jobs.config import JobsConfig
from conveyor.stores import JobStore, StoreError, open_job_store
from conveyor.stores.tenant_records import ApiKeyRecord
from conveyor.tenants.keys import new_key_record

keys_app = typer.Typer(help="API keys in the job store (serve's SQLite or a fleet's PostgreSQL).")

StoreOption = Annotated[
    str | None,
    typer.Option("--store", envvar="CONVEYOR_STORE", help="Job store URL (wins over --data-dir)."),
]
DataDirOption = Annotated[
    Path, typer.Option("--data-dir", help="serve's data directory (its SQLite job store).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def store_url(store: str | None, data_dir: Path) -> str:
    """`--store` if given, else serve's default job store under `data_dir`."""
    return store or JobsConfig().job_store_url_for(data_dir)


@contextmanager
def opened_store(store: str | None, data_dir: Path) -> Iterator[JobStore]:
    """The job store, closed afterwards; a store error exits with code 1."""
    try:
        job_store = open_job_store(store_url(store, data_dir))
    except (StoreError, ValueError) as exc:
        typer.echo(f"cannot open the job store: {exc}", err=True)
        raise typer.Exit(code=1) from None
    try:
        yield job_store
    finally:
        job_store.close()


def key_row(rec: ApiKeyRecord) -> dict[str, object]:
    """What `keys list --json` shows of a key (never the key, nor its digest)."""
    return {
        "id": rec.id,
        "tenant": rec.tenant,
        "prefix": rec.prefix,
        "created_at": rec.created_at,
        "last_used_at": rec.last_used_at,
        "admin": rec.is_admin,
        "revoked_at": rec.revoked_at,
    }


def _when(stamp: int | None) -> str:
    return "-" if stamp is None else datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M")


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the key acts for.")],
    admin: Annotated[bool, typer.Option("--admin", help="May read every tenant's usage.")] = False,
    store: StoreOption = None,
    data_dir: DataDirOption = Path("data"),
    as_json: JsonOption = False,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    key, rec = new_key_record(tenant, is_admin=admin)
    with opened_store(store, data_dir) as job_store:
        job_store.create_api_key(rec)
    if as_json:
        typer.echo(json.dumps({"id": rec.id, "key": key, "tenant": rec.tenant}))
        return
    typer.echo(key)
    Console(stderr=True).print(f"id {rec.id}, tenant {tenant}: store the key now; it is not kept")


@keys_app.command("list")
def list_keys(
    store: StoreOption = None, data_dir: DataDirOption = Path("data"), as_json: JsonOption = False
) -> None:
    """List the keys (id, tenant, prefix, created, last used, admin, revoked)."""
    with opened_store(store, data_dir) as job_store:
        records = job_store.list_api_keys()
    if as_json:
        typer.echo(json.dumps([key_row(rec) for rec in records]))
        return
    table = Table("id", "tenant", "prefix", "created", "last used", "admin", "revoked")
    for rec in records:
        table.add_row(
            rec.id, rec.tenant, rec.prefix + "...", _when(rec.created_at),
            _when(rec.last_used_at), "yes" if rec.is_admin else "", _when(rec.revoked_at),
        )  # fmt: skip
    Console().print(table)


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="Key id (key_...).")],
    store: StoreOption = None,
    data_dir: DataDirOption = Path("data"),
) -> None:
    """Revoke a key: every serving process refuses it within a few seconds."""
    with opened_store(store, data_dir) as job_store:
        is_revoked = job_store.revoke_api_key(key_id, time.time())
    if not is_revoked:
        typer.echo(f"no active key {key_id}", err=True)
        raise typer.Exit(code=1)
    typer.echo(f"revoked {key_id}")
