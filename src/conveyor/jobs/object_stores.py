"""Which object store holds a tenant's batch files: the default one, or its region's.

A tenant pinned to regions (``tenants[].regions``) keeps every batch file of its own (uploads,
batch inputs, shard outputs and checkpoints, output and error files) in the object store of
its *home* region, the first region it lists (``jobs.region_object_store_urls``); every
other tenant keeps them in the default store (``jobs.object_store_url``). Every process of a
fleet makes the same choice for the same tenant, so a file a gateway wrote in one of the
tenant's regions is found by a worker in another of them, and no byte of it is ever written
outside the tenant's regions. A pinned tenant whose home region has no store is a
configuration error at start-up, never a quiet fall-back to the default store.

`object_store_url` is the one pure chooser; `TenantObjectStores` holds the opened stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.errors import ConfigError
from conveyor.jobs.config import JobsConfig
from conveyor.stores.object_store import ObjectStore

__all__ = [
    "TenantObjectStores",
    "check_tenant_stores",
    "object_store_overrides",
    "object_store_url",
    "open_tenant_object_stores",
    "parse_region_urls",
    "tenant_object_store_urls",
]


def object_store_url(
    regions: Sequence[str] | None, region_urls: Mapping[str, str], default_url: str
) -> str:
    """The URL of the store that holds the files of a tenant pinned to ``regions``.

    Unpinned (None or empty): ``default_url``. Pinned: the store of its first region; a
    ``ConfigError`` when that region has none in ``region_urls``.
    """
    if not regions:
        return default_url
    home = regions[0]
    url = region_urls.get(home)
    if url is None:
        raise ConfigError(
            f"pinned to regions {list(regions)}, but region {home!r} has no object store: "
            f"its batch files must stay in its region (set jobs.region_object_store_urls."
            f"{home} or --region-objects {home}=URL)"
        )
    return url


def tenant_object_store_urls(
    tenant_regions: Mapping[str, Sequence[str]],
    region_urls: Mapping[str, str],
    default_url: str,
) -> dict[str, str]:
    """The store URL of every pinned tenant; one ``ConfigError`` naming each one without."""
    urls: dict[str, str] = {}
    problems: list[str] = []
    for tenant, regions in sorted(tenant_regions.items()):
        try:
            urls[tenant] = object_store_url(regions, region_urls, default_url)
        except ConfigError as exc:
            problems.append(f"tenant {tenant!r} is {exc}")
    if problems:
        raise ConfigError("; ".join(problems))
    return urls


class TenantObjectStores:
    """The opened object stores of one process: the default one and each pinned tenant's."""

    def __init__(self, default: ObjectStore, by_tenant: Mapping[str, ObjectStore]) -> None:
        """``by_tenant`` holds the store of every pinned tenant (the others use ``default``)."""
        self.default = default
        self._by_tenant = dict(by_tenant)

    def for_tenant(self, tenant: str) -> ObjectStore:
        """The store that holds ``tenant``'s batch files."""
        return self._by_tenant.get(tenant, self.default)


def open_tenant_object_stores(
    default_url: str,
    tenant_urls: Mapping[str, str],
    opener: Callable[[str], ObjectStore],
) -> TenantObjectStores:
    """Open each distinct URL once (``opener`` is ``open_object_store`` outside tests)."""
    opened: dict[str, ObjectStore] = {default_url: opener(default_url)}
    for url in tenant_urls.values():
        if url not in opened:
            opened[url] = opener(url)
    by_tenant = {tenant: opened[url] for tenant, url in tenant_urls.items()}
    return TenantObjectStores(opened[default_url], by_tenant)


def object_store_overrides(
    jobs: JobsConfig, objects_url: str | None, region_urls: Mapping[str, str]
) -> dict[str, Any]:
    """``jobs`` updates from a fleet process's flags: ``--objects`` replaces the default
    store, ``--region-objects`` entries override the file's stores of those regions."""
    overrides: dict[str, Any] = {}
    if objects_url:
        overrides["object_store_url"] = objects_url
    if region_urls:
        overrides["region_object_store_urls"] = {**jobs.region_object_store_urls, **region_urls}
    return overrides


def parse_region_urls(pairs: Sequence[str]) -> dict[str, str]:
    """``REGION=URL`` pairs (``--region-objects``) as a mapping; a bad pair is a ValueError."""
    result: dict[str, str] = {}
    for pair in pairs:
        region, sep, url = pair.partition("=")
        if not sep or not region or not url:
            raise ValueError(f"--region-objects takes REGION=URL, got {pair!r}")
        if region in result:
            raise ValueError(f"--region-objects names region {region!r} twice")
        result[region] = url
    return result


def check_tenant_stores(
    jobs: JobsConfig,
    tenant_regions: Mapping[str, Sequence[str]],
    objects_url: str | None = None,
    region_urls: Mapping[str, str] | None = None,
) -> None:
    """Start-up check of ``serve``, ``worker`` and ``gateway``: a ``ConfigError`` for each
    resident tenant whose first region has no store in ``jobs`` or the flags."""
    merged = jobs.model_copy(update=object_store_overrides(jobs, objects_url, region_urls or {}))
    default_url = merged.object_store_url or ""
    tenant_object_store_urls(tenant_regions, merged.region_object_store_urls, default_url)
