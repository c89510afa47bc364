"""``check_residency``: the config's region stores, overridden by the flags, must hold every
resident tenant's first region."""

from __future__ import annotations

import pytest

from conveyor.cli.startup_checks import check_residency
from conveyor.config.settings import ServerConfig
from conveyor.errors import ConfigError


def config(region_urls: dict[str, str]) -> ServerConfig:
    return ServerConfig.model_validate({
        "models": [{"name": "m", "kind": "synthetic"}],
        "tenants": [{"name": "acme", "regions": ["eu", "us"]}, {"name": "free"}],
        "jobs": {"region_object_store_urls": region_urls},
    })  # fmt: skip


def test_the_first_region_needs_a_store_from_the_file_or_the_flags() -> None:
    check_residency(config({"eu": "/srv/eu"}))
    check_residency(config({}), region_urls={"eu": "s3://eu/files"})
    with pytest.raises(ConfigError, match="tenant 'acme'"):
        check_residency(config({"us": "/srv/us"}))  # its second region's store is not its home
    with pytest.raises(ConfigError, match="region 'eu'"):
        check_residency(config({}), objects_url="/srv/default")  # the default store never is


def test_without_resident_tenants_nothing_is_needed() -> None:
    check_residency(ServerConfig.model_validate({"models": [{"name": "m", "kind": "synthetic"}]}))
