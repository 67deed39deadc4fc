"""The gateway as a Ray Serve application: the same FastAPI app behind a Serve ingress.

``build_app`` is an application builder (``import_path: gateway.serve_ray:build_app`` in
``deploy/serve.yaml``); its ``args`` are GatewayConfig fields plus ``config`` (a TOML path),
``num_replicas`` and ``max_ongoing_requests``. The vLLM replicas are reached by URL, so the
gateway's own router picks them; Serve only spreads requests over gateway replicas.

No ``from __future__ import annotations`` here: Serve's ingress resolves route signatures at
run time.
"""

from dataclasses import fields
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.gc_tuning import tune_for_serving

DEFAULT_MAX_ONGOING = 1000
BUILDER_ARGS = {"config", "num_replicas", "max_ongoing_requests"}


def config_from_args(args: dict[str, Any]) -> tuple[GatewayConfig, int, int]:
    """``(config, num_replicas, max_ongoing_requests)`` from a Serve config's ``args``."""
    args = dict(args)
    known = {f.name for f in fields(GatewayConfig)} | BUILDER_ARGS
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown foldgate args: {', '.join(unknown)}")
    num_replicas = _positive_int(args.pop("num_replicas", 1), "num_replicas")
    max_ongoing = _positive_int(
        args.pop("max_ongoing_requests", DEFAULT_MAX_ONGOING), "max_ongoing_requests"
    )
    config_path = args.pop("config", None)
    # YAML may give the replicas as a list or as one comma-separated string.
    if isinstance(args.get("replicas"), str):
        args["replicas"] = tuple(u for u in args["replicas"].split(",") if u)
    return GatewayConfig.load(config_path, **args), num_replicas, max_ongoing


def build_app(args: dict[str, Any]) -> Application:
    config, num_replicas, max_ongoing = config_from_args(args)
    if not config.replicas and not config.replica_dns:
        raise ValueError("foldgate args need replicas (URL list) or replica_dns (host:port)")

    # A builder, not an app object: each Serve replica creates its own app, so the store
    # connection and the replica pool are opened by the app's lifespan inside that replica.
    def build_asgi_app() -> FastAPI:
        app = create_app(config)
        tune_for_serving()
        return app

    # The ingress replicas are I/O-bound proxies: no CPU reservation, so they schedule on
    # small nodes next to the vLLM replicas, and a high concurrency limit (Serve's is 5).
    @serve.deployment(
        name="foldgate",
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing,
        ray_actor_options={"num_cpus": 0},
    )
    @serve.ingress(build_asgi_app)
    class FoldgateIngress:
        pass

    return FoldgateIngress.bind()


def fast_path_env(haproxy_ports: tuple[int, int] | None = None) -> dict[str, str]:
    """Environment for Serve's HAProxy ingress and throughput-optimized mode.

    Set it in ``os.environ`` before ``ray.init`` starts the cluster: Serve reads it at import
    in the controller and replica processes. Measured here (shared/notes/ray-serve.md):
    about 1 ms through the ingress with it, 6-7 ms without. ``haproxy_ports`` (stats,
    metrics) moves HAProxy's fixed ports (8404, 9101) to the given free ones, so that several
    clusters (tests, benchmarks) can run on one host; the caller picks them.
    """
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    if haproxy_ports is not None:
        stats, metrics = haproxy_ports
        env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(stats)
        env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(metrics)
    return env


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from exc
    if number < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number
