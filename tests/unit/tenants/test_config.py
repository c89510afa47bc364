"""What the jobs subsystem reads from the tenant settings: weights, budgets, queue bounds."""

from __future__ import annotations

from conveyor.config.settings import ServerConfig


def test_weights_budgets_queue_bounds_and_half_life_come_from_the_config() -> None:
    config = ServerConfig.model_validate({
        "tenants": [
            {"name": "a", "weight": 2, "budget_usd": 100,
             "limits": {"*": {"batch_queue_tokens": 5000}, "llama": {"batch_queue_tokens": 70}}},
            {"name": "b"},
        ],
        "fair_share_half_life_s": 60,
    })  # fmt: skip
    tenancy = config.tenancy
    assert tenancy.weights == {"a": 2.0, "b": 1.0} and tenancy.budgets_usd == {"a": 100.0}
    assert tenancy.fair_share_half_life_s == 60
    assert tenancy.batch_queue_tokens("a", "llama") == 70
    assert tenancy.batch_queue_tokens("a", "other") == 5000
    assert tenancy.batch_queue_tokens("b", "llama") is None


def test_regions_keep_the_configured_order_so_the_first_is_the_home() -> None:
    config = ServerConfig.model_validate({
        "tenants": [{"name": "a", "regions": ["us", "eu", "us"]}, {"name": "b", "regions": ["eu"]},
                    {"name": "c"}],
    })  # fmt: skip
    assert config.tenancy.regions == {"a": ("us", "eu"), "b": ("eu",)}
