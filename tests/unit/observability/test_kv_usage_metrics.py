"""The KV-cache gauges: three families from one snapshot per model."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from conveyor.observability.kv_usage_metrics import KVUsageFamilies, KVUsageSnapshot
from conveyor.observability.metrics import Metrics


def samples(families: list) -> dict[tuple[str, str], float]:
    return {(f.name, s.labels["model"]): s.value for f in families for s in f.samples}


def test_each_model_shows_the_figures_last_set_and_zeros_before() -> None:
    families = KVUsageFamilies(CollectorRegistry())
    families.labels("a").set(3, 5, 8)
    families.labels("b")
    found = samples(list(families.collect()))
    assert found == {
        ("conveyor_kv_blocks_used", "a"): 3, ("conveyor_kv_blocks_free", "a"): 5,
        ("conveyor_kv_cache_usage_ratio", "a"): 3 / 8,
        ("conveyor_kv_blocks_used", "b"): 0, ("conveyor_kv_blocks_free", "b"): 0,
        ("conveyor_kv_cache_usage_ratio", "b"): 0,
    }  # fmt: skip


def test_a_set_during_a_scrape_does_not_tear_it() -> None:
    """The engine sets the figures after a step while a scrape is between families: the
    scrape's three families still come from one moment (three plain gauges showed the
    blocks used before the step beside the blocks free after it)."""
    families = KVUsageFamilies(CollectorRegistry())
    gauges = families.labels("m")
    gauges.set(10, 118, 128)
    scrape = families.collect()
    first = next(scrape)
    gauges.set(12, 116, 128)  # the step ends mid-scrape
    found = samples([first, *scrape])
    assert found[("conveyor_kv_blocks_used", "m")] + found[("conveyor_kv_blocks_free", "m")] == 128
    assert found[("conveyor_kv_cache_usage_ratio", "m")] == 10 / 128
    assert families.snapshots() == {"m": KVUsageSnapshot(12, 116, 128)}


def test_the_service_registry_exports_the_families_once_under_their_names() -> None:
    metrics = Metrics()
    metrics.for_generator("llama").kv_usage.set(1, 63, 64)
    text = generate_latest(metrics.registry).decode()
    assert 'conveyor_kv_blocks_used{model="llama"} 1.0' in text
    assert 'conveyor_kv_blocks_free{model="llama"} 63.0' in text
    assert 'conveyor_kv_cache_usage_ratio{model="llama"} 0.015625' in text
    assert text.count("# TYPE conveyor_kv_blocks_used gauge") == 1
