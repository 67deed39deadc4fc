"""The Helm chart, rendered and linted by Helm's own engine (helm-python-sdk wraps Helm's Go SDK).

Each test renders the chart as `helm template` would, parses the manifests, and checks the
wiring between objects: the gateway's TOML config loads into GatewayConfig and points at the
in-release vLLM headless Service and Redis, GPU pods ask for one GPU, and optional objects
appear only when enabled. The objects are also checked against the Kubernetes API schema
(kubernetes-validate, strict: an unknown or misspelled field fails).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from deploy.cpu.replicas import free_ports
from gateway.config import GatewayConfig
from gateway.serve import serve
from gateway.tenants import hash_key

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "foldgate"
RELEASE, NAMESPACE = "demo", "agents"
KUBE_VERSION = "1.30.0"  # the oldest Kubernetes the chart promises to install on
FULLNAME = f"{RELEASE}-foldgate"

Manifests = dict[tuple[str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(
    chart: helm.Chart,
    values: dict[str, Any] | None = None,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Manifests:
    """All rendered objects by (kind, name); fails on a duplicate."""
    files = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    objects: Manifests = {}
    for path, text in files.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"{key} rendered twice"
            objects[key] = doc
    return objects


def gateway_config(objects: Manifests, tmp_path: Path) -> GatewayConfig:
    """The ConfigMap's TOML, loaded the way `foldgate serve --config` loads it."""
    path = tmp_path / "config.toml"
    path.write_text(objects[("ConfigMap", f"{FULLNAME}-config")]["data"]["config.toml"])
    return GatewayConfig.load(path)


def container(objects: Manifests, kind: str, name: str) -> dict[str, Any]:
    (only,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
    return only


def env_var(cont: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [e for e in cont.get("env", []) if e["name"] == name]
    assert len(matches) == 1, f"{name} in env {cont.get('env')}"
    return matches[0]


def selects(service: dict[str, Any], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return service["spec"]["selector"].items() <= labels.items()


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


VALUE_SETS = {
    "defaults": {},
    "everything-on": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "apiKeys": {"keys": {"sk-1": "acme"}},
        "vllm": {"model": {"source": "hostPath"}, "runtimeClassName": "nvidia"},
        "gateway": {"ray": {"enabled": True}, "nodeSelector": {"pool": "cpu"}},
        "redis": {"persistence": {"enabled": False}},
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "external-everything": {
        "redis": {"external": {"existingSecret": "redis-cred"}},
        "apiKeys": {"existingSecret": "keys"},
        "vllm": {"enabled": False},
        "config": {"replica_dns": "vllm.gpu.svc.cluster.local:8000"},
    },
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [] and problems == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_objects_match_the_kubernetes_schema(chart: helm.Chart, values: dict[str, Any]) -> None:
    for key, doc in render(chart, values).items():
        if doc["apiVersion"] == "monitoring.coreos.com/v1":  # a CRD: tests/helm/crd_schemas
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{key} breaks the Kubernetes schema at {list(exc.path)}: {exc.message}")


def test_every_workload_selects_its_own_pods(chart: helm.Chart) -> None:
    objects = render(chart, {"metrics": {"serviceMonitor": {"enabled": True}}})
    workloads = [o for (kind, _), o in objects.items() if kind in {"Deployment", "StatefulSet"}]
    assert len(workloads) == 3
    for workload in workloads:
        match = workload["spec"]["selector"]["matchLabels"]
        assert match.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    components = {
        w["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] for w in workloads
    }
    assert components == {"gateway", "redis", "vllm"}


def test_gateway_discovers_vllm_through_the_headless_service(
    chart: helm.Chart, tmp_path: Path
) -> None:
    objects = render(chart, {"vllm": {"port": 8001, "replicas": 4}})
    config = gateway_config(objects, tmp_path)
    service = objects[("Service", f"{FULLNAME}-vllm")]
    vllm = objects[("StatefulSet", f"{FULLNAME}-vllm")]

    assert config.replica_dns == f"{FULLNAME}-vllm.{NAMESPACE}.svc.cluster.local:8001"
    assert config.replicas == ()
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service, vllm)
    assert vllm["spec"]["serviceName"] == service["metadata"]["name"]
    assert vllm["spec"]["replicas"] == 4
    cont = container(objects, "StatefulSet", f"{FULLNAME}-vllm")
    assert cont["ports"][0] == {"name": "http", "containerPort": 8001, "protocol": "TCP"}
    assert flag(cont["args"], "--port") == "8001"
    assert service["spec"]["ports"][0]["port"] == 8001


def test_vllm_pods_take_one_gpu_on_gpu_nodes_with_the_gateways_flags(chart: helm.Chart) -> None:
    objects = render(
        chart,
        {
            "vllm": {
                "servedModelName": "qwen-test",
                "model": {"dir": "/weights/qwen", "mountPath": "/weights", "pvcClaimName": "w"},
                "maxModelLen": 65536,
                "gpuMemoryUtilization": 0.85,
                "extraArgs": ["--max-num-seqs", "32"],
            }
        },
    )
    pod = objects[("StatefulSet", f"{FULLNAME}-vllm")]["spec"]["template"]["spec"]
    cont = container(objects, "StatefulSet", f"{FULLNAME}-vllm")
    args = cont["args"]

    assert cont["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert cont["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert cont["resources"]["requests"]["memory"] == "32Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert flag(args, "--model") == "/weights/qwen"
    assert flag(args, "--served-model-name") == "qwen-test"
    assert flag(args, "--max-model-len") == "65536"
    assert flag(args, "--gpu-memory-utilization") == "0.85"
    assert flag(args, "--tool-call-parser") == "qwen3_coder"
    assert flag(args, "--reasoning-parser") == "qwen3"
    assert flag(args, "--max-num-seqs") == "32"
    for needed in (
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
    ):
        assert needed in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "w", "readOnly": True}
    assert {"name": "models", "mountPath": "/weights", "readOnly": True} in cont["volumeMounts"]
    assert env_var(cont, "HF_HUB_OFFLINE")["value"] == "1"


def test_vllm_parsers_are_settable(chart: helm.Chart) -> None:
    objects = render(chart, {"vllm": {"toolCallParser": "hermes", "reasoningParser": ""}})
    args = container(objects, "StatefulSet", f"{FULLNAME}-vllm")["args"]
    assert flag(args, "--tool-call-parser") == "hermes"
    assert "--reasoning-parser" not in args


def test_vllm_priority_scheduling_kv_events_and_offload_tier(
    chart: helm.Chart, tmp_path: Path
) -> None:
    objects = render(chart, {"networkPolicy": {"enabled": True}})
    cont = container(objects, "StatefulSet", f"{FULLNAME}-vllm")
    args = cont["args"]
    assert flag(args, "--scheduling-policy") == "priority"
    events = json.loads(flag(args, "--kv-events-config"))
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:9000",  # the HTTP port + the gateway's kv_events_port_offset
        "topic": "kv",
    }
    assert {"name": "kv-events", "containerPort": 9000, "protocol": "TCP"} in cont["ports"]
    policy = objects[("NetworkPolicy", f"{FULLNAME}-vllm")]["spec"]["ingress"]
    assert any(p["port"] == "kv-events" for rule in policy for p in rule["ports"])
    assert "--kv-offloading-size" not in args
    assert gateway_config(objects, tmp_path).kv_events_port_offset == 1000

    tiered = render(
        chart,
        {
            "vllm": {"kvOffloadingGiB": 64, "kvEvents": {"enabled": False}},
            "config": {"kv_offload_bytes": 64 * 2**30, "kv_events": True, "admission": True},
        },
    )
    args = container(tiered, "StatefulSet", f"{FULLNAME}-vllm")["args"]
    assert flag(args, "--kv-offloading-size") == "64"
    assert "--kv-events-config" not in args
    config = gateway_config(tiered, tmp_path)
    assert config.kv_offload_bytes == 64 * 2**30 and config.kv_events and config.admission


def test_vllm_model_from_host_path(chart: helm.Chart) -> None:
    objects = render(chart, {"vllm": {"model": {"source": "hostPath", "hostPath": "/srv/m"}}})
    pod = objects[("StatefulSet", f"{FULLNAME}-vllm")]["spec"]["template"]["spec"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models == {"name": "models", "hostPath": {"path": "/srv/m", "type": "Directory"}}


def test_probes_use_health(chart: helm.Chart) -> None:
    objects = render(chart, {"vllm": {"startupTimeoutSeconds": 600}})
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    vllm = container(objects, "StatefulSet", f"{FULLNAME}-vllm")

    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # The gateway's /health is 503 while no replica is healthy: liveness must not use it.
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert vllm["startupProbe"]["periodSeconds"] * vllm["startupProbe"]["failureThreshold"] == 600


def test_in_release_redis_is_wired_and_durable(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart, {"redis": {"auth": {"enabled": False}}})
    config = gateway_config(objects, tmp_path)
    service = objects[("Service", f"{FULLNAME}-redis")]
    redis = objects[("StatefulSet", f"{FULLNAME}-redis")]
    args = container(objects, "StatefulSet", f"{FULLNAME}-redis")["args"]

    assert config.store_url == f"redis://{FULLNAME}-redis:6379/0"
    assert "--requirepass" not in args
    assert selects(service, redis)
    assert service["spec"]["ports"][0]["port"] == 6379
    assert flag(args, "--appendonly") == "yes"
    assert flag(args, "--appendfsync") == "everysec"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert "volumes" not in redis["spec"]["template"]["spec"]


def test_redis_password_comes_from_a_secret_into_both_pods(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: Redis requires a password that only Secrets hold. Both pods read it from
    the environment; Kubernetes expands $(STORE_PASSWORD) in the gateway's URL and
    $(REDIS_PASSWORD) in redis-server's args."""
    objects = render(chart)
    secret = objects[("Secret", f"{FULLNAME}-redis")]
    password = base64.b64decode(secret["data"]["password"]).decode()
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    redis = container(objects, "StatefulSet", f"{FULLNAME}-redis")
    ref = {"name": f"{FULLNAME}-redis", "key": "password"}

    assert len(password) == 32 and password.isalnum()
    assert gateway_config(objects, tmp_path).store_url is None  # not in the ConfigMap
    names = [e["name"] for e in gateway["env"]]
    # $(VAR) expands only from variables defined earlier in the list.
    assert names.index("STORE_PASSWORD") < names.index("FOLDGATE_STORE_URL")
    assert env_var(gateway, "STORE_PASSWORD")["valueFrom"]["secretKeyRef"] == ref
    url = env_var(gateway, "FOLDGATE_STORE_URL")["value"]
    assert url == f"redis://:$(STORE_PASSWORD)@{FULLNAME}-redis:6379/0"
    assert flag(redis["args"], "--requirepass") == "$(REDIS_PASSWORD)"
    for name in ("REDIS_PASSWORD", "REDISCLI_AUTH"):  # the server, and redis-cli's probes
        assert env_var(redis, name)["valueFrom"]["secretKeyRef"] == ref

    monkeypatch.setenv("FOLDGATE_STORE_URL", url.replace("$(STORE_PASSWORD)", password))
    assert (
        gateway_config(objects, tmp_path).store_url
        == f"redis://:{password}@{FULLNAME}-redis:6379/0"
    )

    mine = render(chart, {"redis": {"auth": {"existingSecret": "pw", "existingSecretKey": "p"}}})
    assert ("Secret", f"{FULLNAME}-redis") not in mine
    gateway = container(mine, "Deployment", f"{FULLNAME}-gateway")
    assert env_var(gateway, "STORE_PASSWORD")["valueFrom"]["secretKeyRef"] == {
        "name": "pw",
        "key": "p",
    }


def test_redis_without_persistence_uses_empty_dir(chart: helm.Chart) -> None:
    objects = render(chart, {"redis": {"persistence": {"enabled": False}, "appendfsync": "always"}})
    redis = objects[("StatefulSet", f"{FULLNAME}-redis")]
    assert "volumeClaimTemplates" not in redis["spec"]
    assert redis["spec"]["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    args = container(objects, "StatefulSet", f"{FULLNAME}-redis")["args"]
    assert flag(args, "--appendfsync") == "always"


def test_external_redis_url_replaces_the_statefulset(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart, {"redis": {"external": {"url": "redis://sessions.db:6380/3"}}})
    assert gateway_config(objects, tmp_path).store_url == "redis://sessions.db:6380/3"
    assert ("StatefulSet", f"{FULLNAME}-redis") not in objects
    assert ("Service", f"{FULLNAME}-redis") not in objects


def test_external_redis_url_from_a_secret(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart, {"redis": {"external": {"existingSecret": "redis-cred"}}})
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    ref = env_var(gateway, "FOLDGATE_STORE_URL")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "redis-cred", "key": "url"}
    assert gateway_config(objects, tmp_path).store_url is None  # the env var fills it
    assert ("StatefulSet", f"{FULLNAME}-redis") not in objects


def test_inline_api_keys_become_a_secret_the_gateway_reads(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {hash_key("key-b"): "beta", hash_key("key-a"): "acme"}
    objects = render(chart, {"apiKeys": {"keys": keys}})
    secret = objects[("Secret", f"{FULLNAME}-api-keys")]
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    ref = env_var(gateway, "FOLDGATE_API_KEYS")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-api-keys", "key": "api-keys"}
    # every pod salts tenants' prefix caches with the one secret the chart generated
    salt_ref = env_var(gateway, "FOLDGATE_CACHE_SALT_SECRET")["valueFrom"]["secretKeyRef"]
    assert salt_ref == {
        "name": f"{FULLNAME}-api-keys",
        "key": "cache-salt-secret",
        "optional": True,
    }
    assert len(secret["stringData"]["cache-salt-secret"]) == 48

    monkeypatch.setenv("FOLDGATE_API_KEYS", secret["stringData"]["api-keys"])
    monkeypatch.setenv("FOLDGATE_CACHE_SALT_SECRET", secret["stringData"]["cache-salt-secret"])
    config = gateway_config(objects, tmp_path)
    assert config.api_keys == keys
    assert config.cache_salt_secret == secret["stringData"]["cache-salt-secret"]


def test_existing_api_key_secret_is_referenced_not_created(chart: helm.Chart) -> None:
    objects = render(chart, {"apiKeys": {"existingSecret": "keys", "existingSecretKey": "map"}})
    assert ("Secret", f"{FULLNAME}-api-keys") not in objects
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    ref = env_var(gateway, "FOLDGATE_API_KEYS")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "keys", "key": "map"}


def test_no_api_keys_means_no_secret_and_no_env(chart: helm.Chart) -> None:
    objects = render(chart)
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    assert ("Secret", f"{FULLNAME}-api-keys") not in objects
    assert "FOLDGATE_API_KEYS" not in {e["name"] for e in gateway["env"]}


def test_config_values_keep_their_types(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(
        chart,
        {
            "config": {
                "strategy": "refold+cliff",
                "policy": "round_robin",
                "k": 5,
                "budget": 32000,
                "max_body_bytes": 67108864,
                "upstream_timeout_s": 120.5,
                "upstream_model": 'model "quoted" \\ name',
            }
        },
    )
    config = gateway_config(objects, tmp_path)
    assert (config.strategy, config.policy, config.k) == ("refold+cliff", "round_robin", 5)
    assert config.budget == 32000 and isinstance(config.budget, int)
    assert config.max_body_bytes == 67108864 and isinstance(config.max_body_bytes, int)
    assert config.upstream_timeout_s == 120.5
    assert config.upstream_model == 'model "quoted" \\ name'


def test_tenant_fold_map_renders_as_a_toml_table(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(
        chart, {"config": {"fold": "on", "tenant_fold": {"acme": "off", "team b": "auto"}}}
    )
    config = gateway_config(objects, tmp_path)
    assert config.fold == "on"
    assert config.tenant_fold == {"acme": "off", "team b": "auto"}


def test_values_schema_knows_every_gateway_config_field() -> None:
    """values.schema.json closes `config`; it must follow GatewayConfig as fields are added."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_values = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    assert set(schema["properties"]["config"]["properties"]) == {
        f.name for f in fields(GatewayConfig)
    }
    # values.yaml documents every field but the ones the chart fills itself.
    chart_owned = {"store_url", "api_keys", "cache_salt_secret", "replicas", "replica_dns"}
    assert set(config_values) == {f.name for f in fields(GatewayConfig)} - chart_owned


def test_null_config_fields_keep_gateway_defaults(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart)
    toml = tomllib.loads(objects[("ConfigMap", f"{FULLNAME}-config")]["data"]["config.toml"])
    assert "budget" not in toml and "upstream_model" not in toml
    assert gateway_config(objects, tmp_path).budget is None


def test_config_change_rolls_the_gateway(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = render(chart, values)[("Deployment", f"{FULLNAME}-gateway")]
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum({}) != checksum({"config": {"k": 4}})


def test_external_replicas_without_vllm(chart: helm.Chart, tmp_path: Path) -> None:
    urls = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    objects = render(chart, {"vllm": {"enabled": False}, "config": {"replicas": urls}})
    assert gateway_config(objects, tmp_path).replicas == tuple(urls)
    assert not [key for key in objects if "vllm" in key[1]]


def serve_params(objects: Manifests, tmp_path: Path) -> dict[str, Any]:
    """The gateway container's args as the real `foldgate serve` command parses them."""
    config = tmp_path / "config.toml"
    config.write_text(objects[("ConfigMap", f"{FULLNAME}-config")]["data"]["config.toml"])
    args = container(objects, "Deployment", f"{FULLNAME}-gateway")["args"]
    mounted = "/etc/foldgate/config.toml"
    assert flag(args, "--config") == mounted
    args = [str(config) if a == mounted else a for a in args]
    return serve.make_context("serve", args).params


def test_gateway_args_parse_with_foldgate_serve(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart, {"gateway": {"port": 9000}})
    params = serve_params(objects, tmp_path)
    assert (params["host"], params["port"], params["use_ray"]) == ("0.0.0.0", 9000, False)
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    assert gateway["ports"][0]["containerPort"] == 9000

    ray = serve_params(
        render(chart, {"gateway": {"ray": {"enabled": True, "replicas": 3}}}), tmp_path
    )
    assert (ray["use_ray"], ray["ray_replicas"], ray["port"]) == (True, 3, 8080)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_rendered_gateway_boots_and_its_probes_split_as_designed(
    chart: helm.Chart, tmp_path: Path, redis_url: str
) -> None:
    """The pod's config and args start the real gateway. With no vLLM reachable the
    readiness path (/health) fails while the liveness path (/metrics) still answers, so
    Kubernetes takes the pod out of the Service instead of restarting it."""
    port, dead = free_ports(2)
    objects = render(
        chart,
        {
            "vllm": {"enabled": False},
            "config": {"replica_dns": f"localhost:{dead}", "probe_interval_s": 0.2},
            "redis": {"external": {"url": redis_url}},
            "gateway": {"port": port},
        },
    )
    params = serve_params(objects, tmp_path)
    gateway = container(objects, "Deployment", f"{FULLNAME}-gateway")
    readiness = gateway["readinessProbe"]["httpGet"]["path"]
    liveness = gateway["livenessProbe"]["httpGet"]["path"]
    args = [
        str(tmp_path / "config.toml") if a.endswith("config.toml") else a for a in gateway["args"]
    ]
    assert params["port"] == port
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gateway.cli import main; main()", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                live = http_get(base + liveness)
                break
            except OSError:
                assert proc.poll() is None, f"gateway exited: {proc.communicate()[0][-2000:]}"
                assert time.monotonic() < deadline, "gateway did not listen within 60 s"
                time.sleep(0.2)
        ready = http_get(base + readiness)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert live[0] == 200 and "foldgate_requests_total" in live[1]
    assert ready[0] == 503 and json.loads(ready[1])["healthy_replicas"] == []


def test_gateway_service_targets_gateway_pods(chart: helm.Chart) -> None:
    objects = render(chart, {"gateway": {"service": {"type": "LoadBalancer", "port": 443}}})
    service = objects[("Service", FULLNAME)]
    assert selects(service, objects[("Deployment", f"{FULLNAME}-gateway")])
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 443, "targetPort": "http", "protocol": "TCP"}
    ]


def test_service_monitors_only_when_enabled(chart: helm.Chart) -> None:
    assert not [key for key in render(chart) if key[0] == "ServiceMonitor"]

    objects = render(
        chart,
        {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}},
    )
    monitors = {name: o for (kind, name), o in objects.items() if kind == "ServiceMonitor"}
    assert set(monitors) == {f"{FULLNAME}-gateway", f"{FULLNAME}-vllm"}
    for target, monitor in ((FULLNAME, monitors[f"{FULLNAME}-gateway"]),
                            (f"{FULLNAME}-vllm", monitors[f"{FULLNAME}-vllm"])):  # fmt: skip
        service = objects[("Service", target)]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kps"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            service["metadata"]["labels"].items()
        )
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        assert monitor["spec"]["endpoints"][0]["port"] in {
            p["name"] for p in service["spec"]["ports"]
        }

    no_vllm = render(
        chart,
        {
            "metrics": {"serviceMonitor": {"enabled": True}},
            "vllm": {"enabled": False},
            "config": {"replica_dns": "vllm.gpu.svc:8000"},
        },
    )
    assert [name for (kind, name) in no_vllm if kind == "ServiceMonitor"] == [f"{FULLNAME}-gateway"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"store_url": "redis://x"}}, "config.store_url is set by the chart"),
        ({"config": {"api_keys": "a=b"}}, "config.api_keys is set by the chart"),
        ({"config": {"cache_salt_secret": "s"}}, "config.cache_salt_secret is set by the chart"),
        ({"config": {"replica_dns": "x:1"}}, "config.replica_dns conflicts with vllm.enabled"),
        ({"vllm": {"enabled": False}}, "vllm.enabled=false needs config.replicas"),
        ({"vllm": {"model": {"dir": "/elsewhere/m"}}}, "must lie under vllm.model.mountPath"),
        (
            {"vllm": {"model": {"source": "image"}}},
            "source=image needs vllm.model.image.repository",
        ),
        (
            {"vllm": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
            "vllm.resources.limits must not set nvidia.com/gpu",
        ),
        (
            {
                "vllm": {
                    "accelerator": {"resourceName": "amd.com/gpu"},
                    "resources": {"requests": {"amd.com/gpu": 1}},
                }
            },
            "vllm.resources.requests must not set amd.com/gpu",
        ),
        ({"redis": {"external": {"url": "cache:6379"}}}, "must start with redis://"),
        ({"apiKeys": {"keys": {"a,b": "t"}}}, "may not contain ','"),
        ({"config": {"upstream_model": {"nested": 1}}}, "at '/config/upstream_model'"),
        # values.schema.json: a wrong type or an unknown key fails before any template runs.
        ({"vllm": {"replicas": "two"}}, "at '/vllm/replicas': got string, want integer"),
        ({"vllm": {"model": {"source": "s3"}}}, "at '/vllm/model/source'"),
        ({"redis": {"appendfsync": "sometimes"}}, "at '/redis/appendfsync'"),
        ({"gateway": {"mode": "ray"}}, "at '/gateway/mode'"),
        ({"vllm": {"replica": 3}}, "additional properties 'replica' not allowed"),
        ({"config": {"k": "three"}}, "at '/config/k'"),
        ({"config": {"polcy": "sticky"}}, "additional properties 'polcy' not allowed"),
        (
            {"vllm": {"autoscaling": {"enabled": True, "minReplicas": 5}}},
            "minReplicas (5) is above",
        ),
        (
            {"gateway": {"mode": "rayservice", "ray": {"enabled": True}}},
            "with gateway.mode=rayservice leave it false",
        ),
        (
            {"gateway": {"mode": "rayservice"}, "fullnameOverride": "f" * 40},
            "must be a DNS-1035 label of at most 47 characters",
        ),
        (
            {"gateway": {"mode": "rayservice"}, "redis": {"external": {"url": "redis://r:1/0"}}},
            "needs gateway.rayService.gcsFaultTolerance.redisAddress",
        ),
    ],
)
def test_bad_values_fail_with_a_clear_message(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises((helm.HelmRenderError, helm.HelmValuesError), match=re.escape(message)):
        render(chart, values)


def test_notes_tell_how_to_point_an_sdk(chart: helm.Chart) -> None:
    notes = chart.render({}, name=RELEASE, namespace=NAMESPACE)["foldgate/templates/NOTES.txt"]
    assert f"port-forward svc/{FULLNAME} 8080:80" in notes
    assert 'base_url="http://localhost:8080/v1"' in notes
    assert '"x-session-id": "run-42"' in notes


def test_dockerfile_matches_the_chart() -> None:
    """The chart passes only flags to the image: its entrypoint must be `foldgate serve`."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    entrypoint = [json.loads(x.split(None, 1)[1]) for x in lines if x.startswith("ENTRYPOINT")]
    exposed = [x.split()[1] for x in lines if x.startswith("EXPOSE")]
    user = [x.split()[1] for x in lines if x.startswith("USER")]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())

    assert entrypoint[-1] == ["foldgate", "serve"]
    assert "foldgate" in pyproject["project"]["scripts"]
    assert exposed == [str(values["gateway"]["port"])]
    assert user == ["10001:10001"]  # the chart's runAsUser / runAsGroup
