"""The object store chooser: unpinned tenants use the default store, pinned ones their first
region's, a pinned tenant whose region has none is a configuration error."""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigError
from conveyor.fakes import MemoryObjectStore
from conveyor.jobs.config import JobsConfig
from conveyor.jobs.object_stores import (
    TenantObjectStores,
    check_tenant_stores,
    object_store_overrides,
    object_store_url,
    open_tenant_object_stores,
    parse_region_urls,
    tenant_object_store_urls,
)
from conveyor.stores.object_store import ObjectStore

REGIONS = {"eu": "s3://eu-bucket/files", "us": "file:///srv/us"}
DEFAULT = "/srv/objects"


def test_an_unpinned_tenant_uses_the_default_store() -> None:
    assert object_store_url(None, REGIONS, DEFAULT) == DEFAULT
    assert object_store_url((), REGIONS, DEFAULT) == DEFAULT


def test_a_pinned_tenant_uses_its_first_regions_store() -> None:
    assert object_store_url(("eu",), REGIONS, DEFAULT) == REGIONS["eu"]
    assert object_store_url(("us", "eu"), REGIONS, DEFAULT) == REGIONS["us"]
    assert object_store_url(["eu", "us"], REGIONS, DEFAULT) == REGIONS["eu"]


def test_a_pinned_tenant_never_falls_back_to_the_default_store() -> None:
    with pytest.raises(ConfigError, match="region 'ap' has no object store"):
        object_store_url(("ap",), REGIONS, DEFAULT)
    with pytest.raises(ConfigError, match="--region-objects eu=URL"):
        object_store_url(("eu",), {}, DEFAULT)
    # Another of its regions having a store does not help: the first one holds its files.
    with pytest.raises(ConfigError):
        object_store_url(("ap", "eu"), REGIONS, DEFAULT)


def test_every_pinned_tenants_url_and_one_error_naming_each_without() -> None:
    pinned = {"acme": ("eu",), "globex": ("us", "eu")}
    assert tenant_object_store_urls(pinned, REGIONS, DEFAULT) == {
        "acme": REGIONS["eu"], "globex": REGIONS["us"],
    }  # fmt: skip
    assert tenant_object_store_urls({}, {}, DEFAULT) == {}
    with pytest.raises(ConfigError) as caught:
        tenant_object_store_urls({**pinned, "initech": ("ap",), "umbrella": ("sa",)}, REGIONS, "")
    message = str(caught.value)
    assert "tenant 'initech'" in message and "tenant 'umbrella'" in message
    assert "acme" not in message


def test_each_url_is_opened_once_and_tenants_share_their_regions_store() -> None:
    opened: list[str] = []

    def opener(url: str) -> ObjectStore:
        opened.append(url)
        return MemoryObjectStore()

    urls = {"acme": REGIONS["eu"], "globex": REGIONS["eu"], "hooli": REGIONS["us"]}
    stores = open_tenant_object_stores(DEFAULT, urls, opener)
    assert sorted(opened) == sorted([DEFAULT, REGIONS["eu"], REGIONS["us"]])
    assert stores.for_tenant("acme") is stores.for_tenant("globex")
    assert stores.for_tenant("hooli") is not stores.for_tenant("acme")
    assert stores.for_tenant("anyone") is stores.default
    assert stores.for_tenant("acme") is not stores.default


def test_a_region_store_that_is_the_default_url_is_the_same_store() -> None:
    stores = open_tenant_object_stores(DEFAULT, {"acme": DEFAULT}, lambda url: MemoryObjectStore())
    assert stores.for_tenant("acme") is stores.default


def test_for_tenant_keeps_pinned_files_apart() -> None:
    default, eu = MemoryObjectStore(), MemoryObjectStore()
    stores = TenantObjectStores(default, {"acme": eu})
    stores.for_tenant("acme").put_stream("files/a", [b"resident"])
    stores.for_tenant("other").put_stream("files/b", [b"roaming"])
    assert eu.objects == {"files/a": b"resident"} and default.objects == {"files/b": b"roaming"}


def test_region_flags_parse_and_bad_pairs_are_refused() -> None:
    assert parse_region_urls([]) == {}
    assert parse_region_urls(["eu=s3://b/p?region=eu-west-1", "us=/srv/us"]) == {
        "eu": "s3://b/p?region=eu-west-1", "us": "/srv/us",
    }  # fmt: skip
    for bad in (["eu"], ["=url"], ["eu="], ["eu=a", "eu=b"]):
        with pytest.raises(ValueError):
            parse_region_urls(bad)


def test_flags_override_the_files_stores_region_by_region() -> None:
    jobs = JobsConfig(object_store_url="/file-default", region_object_store_urls=dict(REGIONS))
    assert object_store_overrides(jobs, None, {}) == {}
    merged = object_store_overrides(jobs, "/flag-default", {"eu": "/flag-eu", "ap": "/flag-ap"})
    assert merged == {
        "object_store_url": "/flag-default",
        "region_object_store_urls": {"eu": "/flag-eu", "us": REGIONS["us"], "ap": "/flag-ap"},
    }


def test_the_config_refuses_an_empty_region_or_url() -> None:
    for bad in ({"": "/x"}, {"eu": ""}):
        with pytest.raises(ValueError, match="region_object_store_urls"):
            JobsConfig(region_object_store_urls=bad)


def test_start_up_needs_the_first_regions_store_from_the_file_or_the_flags() -> None:
    pinned = {"acme": ("eu", "us")}
    check_tenant_stores(JobsConfig(region_object_store_urls={"eu": "/srv/eu"}), pinned)
    check_tenant_stores(JobsConfig(), pinned, region_urls={"eu": "s3://eu/files"})
    check_tenant_stores(JobsConfig(), {})  # no resident tenant: nothing needed
    with pytest.raises(ConfigError, match="tenant 'acme'"):  # its second region is not home
        check_tenant_stores(JobsConfig(region_object_store_urls={"us": "/srv/us"}), pinned)
    with pytest.raises(ConfigError, match="region 'eu'"):  # the default store never is
        check_tenant_stores(JobsConfig(), pinned, objects_url="/srv/default")
