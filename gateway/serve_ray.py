"""The gateway as a Ray Serve application: the same FastAPI app behind a Serve ingress.

``build_app`` is an application builder (``import_path: gateway.serve_ray:build_app`` in
``deploy/serve.yaml``); its ``args`` are GatewayConfig fields plus ``config`` (a TOML path),
``num_replicas`` and ``max_ongoing_requests``. The vLLM replicas are reached by URL, so the
gateway's own router picks them; Serve only spreads requests over gateway replicas.
"""

from typing import Any

from ray import serve
from ray.serve import Application

from gateway.app import create_app
from gateway.config import GatewayConfig

DEFAULT_MAX_ONGOING = 1000


def build_app(args: dict[str, Any]) -> Application:
    args = dict(args)
    num_replicas = int(args.pop("num_replicas", 1))
    max_ongoing = int(args.pop("max_ongoing_requests", DEFAULT_MAX_ONGOING))
    config_path = args.pop("config", None)
    if isinstance(args.get("replicas"), str):
        args["replicas"] = tuple(u for u in args["replicas"].split(",") if u)
    config = GatewayConfig.load(config_path, **args)
    fastapi_app = create_app(config)

    # The ingress replicas are I/O-bound proxies: no CPU reservation, so they schedule on
    # small nodes next to the vLLM replicas, and a high concurrency limit (Serve's is 5).
    @serve.deployment(
        name="foldgate",
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing,
        ray_actor_options={"num_cpus": 0},
    )
    @serve.ingress(fastapi_app)
    class FoldgateIngress:
        pass

    return FoldgateIngress.bind()
