"""What the chart does for operations: the gateway as a KubeRay RayService built from
deploy/serve.yaml, vLLM autoscaling on its queue, the Grafana dashboard, and the CPU-only
profile that serves the tests' tiny model with the tests' flags."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest
from ray.serve import Application
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

import gateway.metrics
import router.telemetry
from deploy.cpu.replicas import DEFAULT_KV_CACHE_BYTES, server_command
from gateway.config import GatewayConfig
from gateway.serve_ray import build_app, config_from_args
from tests.helm import dashboard
from tests.helm.test_chart import CHART, FULLNAME, NAMESPACE, ROOT, container, env_var, render

SERVE_YAML = ROOT / "deploy" / "serve.yaml"
RAYSERVICE = ("RayService", f"{FULLNAME}-gateway")
# The release deploy/serve.yaml describes (its header): "foldgate" in namespace "default".
SERVE_YAML_RELEASE = {"name": "foldgate", "namespace": "default"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def profile(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "helm" / "profiles" / f"{name}.yaml").read_text())


def serve_config(objects: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    return yaml.safe_load(objects[("RayService", f"{name}-gateway")]["spec"]["serveConfigV2"])


def ray_containers(service: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_serve_config_v2_is_what_deploy_serve_yaml_builds(chart: helm.Chart) -> None:
    """Rendered for the release deploy/serve.yaml documents, serveConfigV2 is that file: the
    same Serve options and application, and builder args that build the same gateway."""
    values = {"gateway": {"mode": "rayservice"}, "redis": {"auth": {"enabled": False}}}
    rendered = serve_config(render(chart, values, **SERVE_YAML_RELEASE), "foldgate")
    expected = yaml.safe_load(SERVE_YAML.read_text())
    ServeDeploySchema.model_validate(rendered)

    (app,), (expected_app,) = rendered["applications"], expected["applications"]
    assert rendered["http_options"] == expected["http_options"]
    assert {k: v for k, v in app.items() if k != "args"} == {
        k: v for k, v in expected_app.items() if k != "args"
    }
    assert config_from_args(app["args"]) == config_from_args(expected_app["args"])
    assert isinstance(
        call_user_app_builder_with_args_if_necessary(build_app, app["args"]), Application
    )


def test_serve_args_carry_the_same_config_as_deployment_mode(
    chart: helm.Chart, tmp_path: Path
) -> None:
    """One values.config, two modes: the Serve builder's args and the Deployment's TOML load
    into the same GatewayConfig."""
    values = {
        "config": {"strategy": "refold+cliff", "budget": 32000, "k": 4, "upstream_timeout_s": 90.5},
        "redis": {"external": {"url": "redis://sessions:6379/2"}},
        "gateway": {
            "rayService": {
                "serve": {"numReplicas": 3, "maxOngoingRequests": 64},
                "gcsFaultTolerance": {"redisAddress": "sessions:6379"},
            }
        },
    }
    toml = tmp_path / "config.toml"
    toml.write_text(
        render(chart, values)[("ConfigMap", f"{FULLNAME}-config")]["data"]["config.toml"]
    )
    ray = render(chart, values | {"gateway": {"mode": "rayservice", **values["gateway"]}})
    args = serve_config(ray, FULLNAME)["applications"][0]["args"]

    config, num_replicas, max_ongoing = config_from_args(args)
    assert config == GatewayConfig.load(toml)
    assert (config.budget, config.store_url) == (32000, "redis://sessions:6379/2")
    assert (num_replicas, max_ongoing) == (3, 64)
    assert ("Deployment", f"{FULLNAME}-gateway") not in ray
    assert ("ConfigMap", f"{FULLNAME}-config") not in ray


def test_rayservice_secrets_reach_serve_replicas_through_env_only(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(chart, {"gateway": {"mode": "rayservice"}, "apiKeys": {"keys": {"sk-1": "t"}}})
    service = objects[RAYSERVICE]
    args = serve_config(objects, FULLNAME)["applications"][0]["args"]
    assert "store_url" not in args and "api_keys" not in args  # args beat env in the builder
    for cont in ray_containers(service):
        assert env_var(cont, "STORE_PASSWORD")["valueFrom"]["secretKeyRef"]["name"] == (
            f"{FULLNAME}-redis"
        )
        url = env_var(cont, "FOLDGATE_STORE_URL")["value"]
        assert url == f"redis://:$(STORE_PASSWORD)@{FULLNAME}-redis:6379/0"
        assert env_var(cont, "FOLDGATE_API_KEYS")["valueFrom"]["secretKeyRef"]["name"] == (
            f"{FULLNAME}-api-keys"
        )
        assert env_var(cont, "RAY_SERVE_ENABLE_HA_PROXY")["value"] == "1"
    monkeypatch.setenv("FOLDGATE_STORE_URL", "redis://:pw@h:6379/0")
    monkeypatch.setenv("FOLDGATE_API_KEYS", "sk-1=t")
    config, _, _ = config_from_args(args)
    assert (config.store_url, config.api_keys) == ("redis://:pw@h:6379/0", {"sk-1": "t"})

    ft = service["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert ft == {
        "redisAddress": f"{FULLNAME}-redis:6379",
        "redisPassword": {
            "valueFrom": {"secretKeyRef": {"name": f"{FULLNAME}-redis", "key": "password"}}
        },
    }
    no_ft = render(
        chart,
        {
            "gateway": {
                "mode": "rayservice",
                "rayService": {"gcsFaultTolerance": {"enabled": False}},
            }
        },
    )
    assert "gcsFaultToleranceOptions" not in no_ft[RAYSERVICE]["spec"]["rayClusterConfig"]


@pytest.mark.parametrize("ft", [True, False])
def test_rayservice_passes_kuberays_own_validation(chart: helm.Chart, ft: bool) -> None:
    """The rules KubeRay's operator checks before it creates anything
    (controllers/ray/utils/validation.go): the name leaves room for the RayCluster suffix,
    and with GCS fault tolerance the head sets neither REDIS_PASSWORD, RAY_REDIS_ADDRESS
    nor a redis-password start parameter."""
    values = {
        "gateway": {"mode": "rayservice", "rayService": {"gcsFaultTolerance": {"enabled": ft}}}
    }
    service = render(chart, values)[RAYSERVICE]
    cluster = service["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    names = {e["name"] for e in head["template"]["spec"]["containers"][0]["env"]}

    assert len(service["metadata"]["name"]) <= 47
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", service["metadata"]["name"])
    assert not {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS", "REDIS_USERNAME"} & names
    assert "redis-password" not in head["rayStartParams"]
    assert ("gcsFaultToleranceOptions" in cluster) == ft


def test_rayservice_groups_take_their_scheduling_values(chart: helm.Chart) -> None:
    group = {
        "resources": {"requests": {"cpu": "2", "memory": "3Gi"}},
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
    }
    objects = render(
        chart,
        {
            "gateway": {
                "mode": "rayservice",
                "rayService": {
                    "head": group,
                    "workers": group | {"replicas": 3, "minReplicas": 2, "maxReplicas": 5},
                },
            }
        },
    )
    cluster = objects[RAYSERVICE]["spec"]["rayClusterConfig"]
    (workers,) = cluster["workerGroupSpecs"]
    assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (3, 2, 5)
    for spec in (cluster["headGroupSpec"], workers):
        pod = spec["template"]["spec"]
        assert pod["nodeSelector"] == group["nodeSelector"]
        assert pod["tolerations"] == group["tolerations"]
        assert pod["affinity"] == group["affinity"]
        assert pod["topologySpreadConstraints"] == group["topologySpreadConstraints"]
        assert pod["containers"][0]["resources"]["requests"] == group["resources"]["requests"]
    assert cluster["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0"}
    service = objects[("Service", FULLNAME)]
    assert service["spec"]["selector"]["ray.io/serve"] == "true"
    assert service["spec"]["ports"][0]["targetPort"] == "serve"


def test_keda_scales_vllm_on_waiting_requests_per_replica(chart: helm.Chart) -> None:
    objects = render(chart, profile("keda"))
    scaled = objects[("ScaledObject", f"{FULLNAME}-vllm")]["spec"]
    vllm = objects[("StatefulSet", f"{FULLNAME}-vllm")]
    (trigger,) = scaled["triggers"]
    query = trigger["metadata"]["query"]

    assert scaled["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": vllm["metadata"]["name"],
    }
    assert "replicas" not in vllm["spec"]  # KEDA's HPA owns the count
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 8)
    assert scaled["cooldownPeriod"] == 600
    # Below zero-scaling KEDA's cooldown does not apply; the HPA's stabilization window does.
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    assert (trigger["type"], trigger["metricType"], trigger["metadata"]["threshold"]) == (
        "prometheus",
        "AverageValue",
        "4",
    )
    assert query.startswith("sum(vllm:num_requests_waiting{")
    assert f'namespace="{NAMESPACE}"' in query
    pods = re.search(r'pod=~"([^"]+)"', query)[1]  # type: ignore[index]
    assert re.fullmatch(pods, f"{FULLNAME}-vllm-0") and re.fullmatch(pods, f"{FULLNAME}-vllm-11")
    assert not re.fullmatch(pods, f"{FULLNAME}-gateway-7d9f-x2")

    gateway_hpa = objects[("HorizontalPodAutoscaler", f"{FULLNAME}-gateway")]["spec"]
    assert gateway_hpa["scaleTargetRef"]["name"] == f"{FULLNAME}-gateway"
    assert gateway_hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in objects[("Deployment", f"{FULLNAME}-gateway")]["spec"]


def test_hpa_alternative_uses_the_adapter_metric(chart: helm.Chart) -> None:
    objects = render(
        chart,
        {"vllm": {"autoscaling": {"enabled": True, "kind": "hpa", "waitingThreshold": 2.5}}},
    )
    assert not [key for key in objects if key[0] == "ScaledObject"]
    hpa = objects[("HorizontalPodAutoscaler", f"{FULLNAME}-vllm")]["spec"]
    (metric,) = hpa["metrics"]
    assert hpa["scaleTargetRef"]["kind"] == "StatefulSet"
    assert metric["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "2.5"}
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600


def test_dashboard_configmap_is_the_repo_json_for_grafanas_sidecar(chart: helm.Chart) -> None:
    folder = {"grafana_folder": "LLM"}
    objects = render(chart, {"metrics": {"grafanaDashboard": {"annotations": folder}}})
    config_map = objects[("ConfigMap", f"{FULLNAME}-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == folder
    assert json.loads(config_map["data"]["foldgate.json"]) == dashboard.load()
    off = render(chart, {"metrics": {"grafanaDashboard": {"enabled": False}}})
    assert ("ConfigMap", f"{FULLNAME}-dashboard") not in off


def test_dashboard_panels_query_through_a_prometheus_datasource() -> None:
    board = dashboard.load()
    panels = [p for p in board["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in panels}
    # The issue's panels, foldgate's and vLLM's.
    for wanted in (
        "Requests by dialect and status",
        "Prompt tokens: raw, rendered, upstream",
        "Tokens saved",
        "Upstream cached share",
        "Stubs, folds, restores",
        "Routing decisions",
        "Session moves and failovers",
        "Render and added latency",
        "Prefix-cache hit rate",
        "Queue time",
        "Requests running and waiting",
        "KV cache usage",
        "Preemptions",
    ):
        assert wanted in titles
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            names = dashboard.metric_names(target["expr"])
            assert names, f"{panel['title']}: no metric in {target['expr']}"
            assert all(n.startswith(("foldgate_", "vllm:")) for n in names), names
            if "vllm:" in target["expr"]:  # per replica
                assert "pod" in target["expr"]


def test_metric_name_lookup_reads_selectors_and_declared_families() -> None:
    expr = (
        'sum by (pod) (rate(vllm:prefix_cache_hits_total{namespace="$namespace", kind="raw"}[5m]))'
        ' / histogram_quantile(0.5, sum by (le) (rate(foldgate_render_seconds_bucket{a="b"}[1m])))'
    )
    assert dashboard.metric_names(expr) == {
        "vllm:prefix_cache_hits_total",
        "foldgate_render_seconds_bucket",
    }
    exposition = (
        "# HELP moves_total m\n# TYPE moves_total counter\n"  # labelled, no sample yet
        "# HELP lat l\n# TYPE lat histogram\n"
        'lat_bucket{le="+Inf"} 1.0\nlat_count 1.0\nlat_sum 0.5\n'
        "# HELP up_now u\n# TYPE up_now gauge\nup_now 1.0\n"
    )
    names = dashboard.exposed_names(exposition)
    assert {"moves_total", "lat_bucket", "lat_sum", "lat_count", "up_now"} <= names
    assert "moves" not in names and "lat" not in names


def test_gateway_metrics_on_the_dashboard_are_registered() -> None:
    """The foldgate half without a server: every foldgate_* name the dashboard reads is
    declared by gateway.metrics or router.telemetry (the e2e check scrapes real servers)."""
    assert gateway.metrics and router.telemetry  # imported for their registrations
    exposed = dashboard.exposed_names(generate_latest(REGISTRY).decode())
    wanted = {
        name
        for expr in dashboard.queries(dashboard.load())
        for name in dashboard.metric_names(expr)
        if name.startswith("foldgate_")
    }
    assert wanted and wanted <= exposed, wanted - exposed


def flag_pairs(args: list[str]) -> dict[str, str | None]:
    pairs: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else None
            pairs[arg] = None if following is None or following.startswith("--") else following
    return pairs


def test_cpu_profile_serves_the_tests_model_with_the_tests_flags(chart: helm.Chart) -> None:
    values = profile("cpu")
    objects = render(chart, values)
    pod = objects[("StatefulSet", f"{FULLNAME}-vllm")]["spec"]["template"]["spec"]
    vllm = container(objects, "StatefulSet", f"{FULLNAME}-vllm")
    expected = flag_pairs(
        server_command(Path("python"), Path("/m"), "tiny", 1, DEFAULT_KV_CACHE_BYTES)[3:]
    )
    got = flag_pairs(vllm["args"])
    for name, value in expected.items():
        if name in {"--host", "--port", "--model"}:
            continue
        assert name in got and got[name] == value, (name, got.get(name), value)
    assert got["--model"] == values["vllm"]["model"]["dir"]
    assert "--gpu-memory-utilization" not in got
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert not [r for r in vllm["resources"]["limits"] if "/" in r]

    (copy,) = pod["initContainers"]
    assert copy["image"].endswith("foldgate-tiny-model:0.1.0")
    assert {e["name"]: e["value"] for e in copy["env"]} == {
        "SOURCE": "/model",
        "DEST": "/models/tiny-qwen3.6",
    }
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models == {"name": "models", "emptyDir": {"sizeLimit": "1Gi"}}
    assert {"name": "models", "mountPath": "/models"} in copy["volumeMounts"]
