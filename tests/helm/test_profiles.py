"""Every values profile (helm/profiles/*.yaml, plus the defaults) rendered by Helm's engine,
linted, validated, and checked for the invariants an operator relies on.

Built-in kinds are validated against the Kubernetes 1.30 schema (kubernetes-validate, strict);
the custom resources against the structural schemas in tests/helm/crd_schemas/ (KubeRay v1.3
RayService, KEDA v2.15 ScaledObject, Prometheus Operator v0.75 ServiceMonitor), and the pod
templates a RayService embeds against the Kubernetes schema as v1/PodTemplate.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from gateway.tenants import hash_key
from tests.helm.test_chart import (
    CHART,
    FULLNAME,
    KUBE_VERSION,
    NAMESPACE,
    ROOT,
    Manifests,
    render,
)

PROFILES_DIR = ROOT / "helm" / "profiles"
SCHEMAS_DIR = Path(__file__).parent / "crd_schemas"
PROFILES: dict[str, dict[str, Any]] = {"default": {}} | {
    path.stem: yaml.safe_load(path.read_text()) for path in sorted(PROFILES_DIR.glob("*.yaml"))
}
CRD_SCHEMAS = {
    ("ray.io/v1", "RayService"): "rayservice.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.yaml",
}
# Extended resources that mean an accelerator, whatever the vendor.
ACCELERATORS = ("nvidia.com/", "amd.com/", "gpu.intel.com/", "google.com/tpu", "habana.ai/")


def test_the_issue_profiles_exist() -> None:
    assert set(PROFILES) == {"default", "rayservice", "external-redis", "keda", "cpu"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def rendered(chart: helm.Chart) -> dict[str, Manifests]:
    return {name: render(chart, values) for name, values in PROFILES.items()}


def crd_validator(filename: str) -> jsonschema.Draft7Validator:
    common = yaml.safe_load((SCHEMAS_DIR / "common.yaml").read_text())
    registry = Registry().with_resource(
        "common.yaml", Resource.from_contents(common, default_specification=DRAFT7)
    )
    schema = yaml.safe_load((SCHEMAS_DIR / filename).read_text())
    return jsonschema.Draft7Validator(schema, registry=registry)


def with_kuberay_labels(template: dict[str, Any], node_type: str) -> dict[str, Any]:
    """The template as KubeRay creates its pods: plus the labels KubeRay adds (node type, and
    ray.io/serve while the pod's Serve proxy is healthy)."""
    labels = template["metadata"]["labels"] | {
        "ray.io/node-type": node_type,
        "ray.io/serve": "true",
    }
    return {**template, "metadata": {**template["metadata"], "labels": labels}}


def pod_templates(objects: Manifests) -> list[tuple[str, str, dict[str, Any]]]:
    """(where, component, pod template) for every workload, RayService groups included."""
    found = []
    for (kind, name), obj in objects.items():
        if kind in {"Deployment", "StatefulSet"}:
            found.append((f"{kind}/{name}", obj["spec"]["template"]))
        elif kind == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            head = cluster["headGroupSpec"]["template"]
            found.append((f"{kind}/{name}/head", with_kuberay_labels(head, "head")))
            for group in cluster["workerGroupSpecs"]:
                worker = with_kuberay_labels(group["template"], "worker")
                found.append((f"{kind}/{name}/{group['groupName']}", worker))
    return [
        (where, t["metadata"]["labels"]["app.kubernetes.io/component"], t) for where, t in found
    ]


def containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def selects(selector: dict[str, str], template: dict[str, Any]) -> bool:
    return selector.items() <= template["metadata"]["labels"].items()


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_lints_clean(profile: str) -> None:
    report = helm.lint(
        CHART, PROFILES[profile], strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_objects_match_their_schemas(rendered: dict[str, Manifests], profile: str) -> None:
    objects = rendered[profile]
    for key, doc in objects.items():
        schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if schema is None:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{key} breaks the Kubernetes schema at {list(exc.path)}: {exc.message}"
                )
            continue
        errors = [f"{list(e.path)}: {e.message}" for e in crd_validator(schema).iter_errors(doc)]
        assert errors == [], f"{key} breaks {schema}"
    for (kind, name), obj in objects.items():
        if kind != "RayService":
            continue
        cluster = obj["spec"]["rayClusterConfig"]
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        for where, template in (
            (f"{name}/{g.get('groupName', 'head')}", g["template"]) for g in groups
        ):
            pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
            try:
                kubernetes_validate.validate({**pod, "template": template}, KUBE_VERSION, True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{where} is not a valid pod template at {list(exc.path)}: {exc.message}"
                )


def test_crd_schemas_catch_what_the_api_would_refuse() -> None:
    """The structural schemas are closed: a misplaced field or a wrong type fails."""
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "interval": "15s"}]},
    }
    validator = crd_validator("servicemonitor.yaml")
    assert validator.is_valid(monitor)
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    assert not validator.is_valid(monitor)

    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "s"},
        "spec": {
            "scaleTargetRef": {"name": "x"},
            "triggers": [{"type": "prometheus", "metadata": {"serverAddress": "http://p:9090",
                                                             "query": "up", "threshold": 4}}],
        },
    }  # fmt: skip
    assert not crd_validator("scaledobject.yaml").is_valid(scaled)  # threshold: a string
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "r"},
        "spec": {"rayClusterConfig": {"headGroupSpec": {"template": {}}, "workers": []}},
    }
    assert not crd_validator("rayservice.yaml").is_valid(service)


@pytest.mark.parametrize("profile", PROFILES)
def test_accelerators_only_on_vllm_pods(rendered: dict[str, Manifests], profile: str) -> None:
    values = PROFILES[profile].get("vllm", {})
    count = values.get("accelerator", {}).get("count", 1)
    for where, component, template in pod_templates(rendered[profile]):
        for cont in containers(template):
            resources = cont.get("resources", {})
            asked = {
                name: amount
                for kind in ("requests", "limits")
                for name, amount in resources.get(kind, {}).items()
                if name.startswith(ACCELERATORS)
            }
            if component == "vllm" and cont["name"] == "vllm" and count:
                assert resources["limits"]["nvidia.com/gpu"] == count, where
                assert resources["requests"]["nvidia.com/gpu"] == count, where
            else:
                assert asked == {}, f"{where}/{cont['name']} asks for {asked}"
        if component == "vllm":
            selector = template["spec"].get("nodeSelector", {})
            assert ("nvidia.com/gpu.present" in selector) == bool(count), where


@pytest.mark.parametrize("profile", PROFILES)
def test_every_container_has_probes_and_requests(
    rendered: dict[str, Manifests], profile: str
) -> None:
    for where, component, template in pod_templates(rendered[profile]):
        for cont in containers(template):
            requests = cont.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= requests.keys(), f"{where}/{cont['name']}: {requests}"
        for cont in template["spec"]["containers"]:
            assert "readinessProbe" in cont and "livenessProbe" in cont, f"{where}/{cont['name']}"
        if component == "vllm":
            (vllm,) = template["spec"]["containers"]
            startup = vllm["startupProbe"]
            timeout = PROFILES[profile].get("vllm", {}).get("startupTimeoutSeconds", 1800)
            # Liveness only starts once the startup probe passed: a loading pod is never killed.
            assert startup["periodSeconds"] * startup["failureThreshold"] >= timeout
            assert startup["httpGet"]["path"] == vllm["readinessProbe"]["httpGet"]["path"]


@pytest.mark.parametrize("profile", PROFILES)
def test_gateway_and_redis_run_as_non_root(rendered: dict[str, Manifests], profile: str) -> None:
    for where, component, template in pod_templates(rendered[profile]):
        if component == "vllm":  # vLLM's images run as root and write to their home
            continue
        security = template["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, where
        for cont in template["spec"]["containers"]:
            assert cont["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert cont["securityContext"]["capabilities"]["drop"] == ["ALL"], where


def secret_values(objects: Manifests) -> set[str]:
    found = set()
    for (kind, _), obj in objects.items():
        if kind == "Secret":
            found.update(obj.get("stringData", {}).values())
            found.update(base64.b64decode(v).decode() for v in obj.get("data", {}).values())
    return found


@pytest.mark.parametrize("profile", PROFILES)
def test_no_secret_value_outside_a_secret(chart: helm.Chart, profile: str) -> None:
    values = PROFILES[profile]
    if not values.get("apiKeys", {}).get("existingSecret"):
        values = {**values, "apiKeys": {"keys": {hash_key("sk-live-4b1d9e"): "acme"}}}
    objects = render(chart, values)
    secrets = secret_values(objects)
    if not values.get("redis", {}).get("external"):
        assert len(secrets) == 3  # the API key map, the cache-salt secret, the Redis password
    # Each API key of a "key=tenant,..." map on its own (tenants are not secret).
    pieces = {pair.split("=")[0] for secret in secrets for pair in secret.split(",")}
    for key, obj in objects.items():
        if key[0] == "Secret":
            continue
        text = json.dumps(obj)
        for piece in pieces:
            assert piece not in text, f"{key} holds a secret value"
    for where, _, template in pod_templates(objects):
        for cont in containers(template):
            for env in cont.get("env", []):
                if any(word in env["name"] for word in ("PASSWORD", "API_KEY", "TOKEN", "AUTH")):
                    assert "valueFrom" in env, f"{where}: {env['name']} is inline"
                if env["name"] == "FOLDGATE_STORE_URL" and "value" in env:
                    assert "$(STORE_PASSWORD)@" in env["value"] or "@" not in env["value"]


def ingress_peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]


@pytest.mark.parametrize("profile", PROFILES)
def test_network_policies_let_only_the_gateway_in(
    rendered: dict[str, Manifests], profile: str
) -> None:
    objects = rendered[profile]
    templates = pod_templates(objects)
    policies = {name: o for (kind, name), o in objects.items() if kind == "NetworkPolicy"}
    external_redis = bool(PROFILES[profile].get("redis", {}).get("external"))
    expected = {f"{FULLNAME}-vllm"} | (set() if external_redis else {f"{FULLNAME}-redis"})
    assert set(policies) == expected
    for name, policy in policies.items():
        guarded = name.rsplit("-", 1)[1]
        target = policy["spec"]["podSelector"]["matchLabels"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert {c for _, c, t in templates if selects(target, t)} == {guarded}
        pod_peers = [p for p in ingress_peers(policy) if "podSelector" in p]
        assert len(pod_peers) == 1 and "namespaceSelector" not in pod_peers[0]
        allowed = {
            where
            for where, _, t in templates
            if selects(pod_peers[0]["podSelector"]["matchLabels"], t)
        }
        assert allowed == {where for where, c, _ in templates if c == "gateway"}, allowed
        others = [p for p in ingress_peers(policy) if "podSelector" not in p]
        if guarded == "redis":
            assert others == []
        else:  # Prometheus may scrape vLLM, from its namespace only
            assert others == [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                }
            ]


@pytest.mark.parametrize("profile", PROFILES)
def test_disruption_budgets_cover_their_pods(rendered: dict[str, Manifests], profile: str) -> None:
    objects = rendered[profile]
    templates = pod_templates(objects)
    budgets = {name: o for (kind, name), o in objects.items() if kind == "PodDisruptionBudget"}
    assert set(budgets) == {f"{FULLNAME}-gateway", f"{FULLNAME}-vllm"}
    for name, budget in budgets.items():
        component = name.rsplit("-", 1)[1]
        selector = budget["spec"]["selector"]["matchLabels"]
        covered = {where for where, _, t in templates if selects(selector, t)}
        expected = {where for where, c, _ in templates if c == component}
        if profile == "rayservice" and component == "gateway":
            # The workers only: KubeRay recreates the head itself.
            expected = {where for where in expected if not where.endswith("/head")}
        assert covered == expected and covered, (name, covered)
        assert budget["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("profile", PROFILES)
def test_services_select_their_pods(rendered: dict[str, Manifests], profile: str) -> None:
    objects = rendered[profile]
    templates = pod_templates(objects)
    for (kind, name), service in objects.items():
        if kind != "Service":
            continue
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        covered = {w for w, _, t in templates if selects(service["spec"]["selector"], t)}
        assert covered == {w for w, c, _ in templates if c == component}, name
        port = service["spec"]["ports"][0]["targetPort"]
        for where in covered:
            template = next(t for w, _, t in templates if w == where)
            names = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert port in names, (name, where)
