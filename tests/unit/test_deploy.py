"""Every manifest in deploy/ is valid, and the autoscaler asks for metrics the gateway exports.

Kubernetes kinds are checked by kubernetes-validate against its bundled (offline) schemas;
the KEDA ScaledObject against KEDA's own CRD schema, vendored in tests/fixtures.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.stores import open_job_store

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KEDA_CRD = ROOT / "tests" / "fixtures" / "keda_scaledobjects_crd.yaml"
KUBERNETES_VERSION = "1.30.0"
METRIC = re.compile(r"\b(conveyor_[a-z_]+)(?:\{([^}]*)\})?")


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every YAML document in deploy/, with the file it came from."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path.name, doc))
    return found


def scaled_objects() -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == "ScaledObject"]


def keda_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_deploy_has_the_expected_manifests() -> None:
    kinds = sorted((name, doc["kind"]) for name, doc in documents())
    assert ("secret.yaml", "Secret") in kinds and ("scaledobject.yaml", "ScaledObject") in kinds
    assert len(scaled_objects()) == 1


@pytest.mark.parametrize(
    ("name", "doc"), documents(), ids=lambda v: v if isinstance(v, str) else v["kind"]
)
def test_each_manifest_is_valid(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] == "ScaledObject":
        jsonschema.validate(doc, keda_schema())
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_wrong_field_is_caught() -> None:
    (scaled,) = scaled_objects()
    broken = {**scaled, "spec": {**scaled["spec"], "minReplicaCount": "one"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, keda_schema())
    (_, gateway) = next((n, d) for n, d in documents() if d["kind"] == "Deployment")
    bad = {**gateway, "spec": {**gateway["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_secrets_stay_out_of_the_configmap() -> None:
    for _, doc in documents():
        if doc["kind"] == "ConfigMap":
            text = yaml.safe_dump(doc["data"])
            assert "CONVEYOR_STORE" not in text and "api_keys" not in text
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            refs = [ref.get("secretRef", {}).get("name") for ref in container["envFrom"]]
            assert "conveyor-secrets" in refs
            if "gateway" in container["args"]:
                assert "--require-api-keys" in container["args"]


async def _exported(tmp_path: Path, model: str) -> dict[str, set[str]]:
    """Metric names a gateway exports (with one worker and one arrival), and their labels."""
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(url)
    store.upsert_worker("w1", "http://w1:1", [model], 8, {}, time.time())
    gateway = Gateway(GatewaySettings(store_url=url), store)
    await gateway.start()
    try:
        gateway.count_arrival(model, 1)
        gateway.on_refresh()
        return _sample_labels(gateway.metrics.registry)
    finally:
        await gateway.stop()


def _sample_labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    exported: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


@pytest.mark.anyio
async def test_the_scaled_object_queries_metrics_the_gateway_exports(tmp_path: Path) -> None:
    (scaled,) = scaled_objects()
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    models = set(re.findall(r'model="([^"]+)"', " ".join(queries)))
    assert len(models) == 1
    exported = await _exported(tmp_path, models.pop())
    used = [(name, labels) for q in queries for name, labels in METRIC.findall(q)]
    assert used
    for name, labels in used:
        assert name in exported, f"{name} is not exported by the gateway"
        for label in re.findall(r"(\w+)\s*=", labels):
            assert label in exported[name], f"{name} has no label {label!r}"
    # The per-replica service rate divides by the workers hosting that model.
    assert any(name == "conveyor_fleet_workers" and "model=" in labels for name, labels in used)


def test_a_gateway_that_requires_keys_refuses_to_start_without_them(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from conveyor.cli.main import app

    args = ["gateway", "--store", f"sqlite://{tmp_path}/j.sqlite", "--require-api-keys"]
    result = CliRunner().invoke(app, args, env={"CONVEYOR_API_KEYS": ""})
    assert result.exit_code == 2 and "--require-api-keys" in result.output
