"""A real local Ray cluster serving the gateway through Serve's HTTP ingress (HAProxy).

``ray_serve_gateway`` (module scope) starts Ray once; calling it with builder args deploys
(or redeploys) the gateway application and returns its base URL. Teardown shuts Serve and
Ray down. Ray reads the environment when its processes start, so it is set before
``ray.init`` and put back afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deploy.cpu.replicas import free_ports
from gateway.serve_ray import build_app, fast_path_env


@pytest.fixture(scope="module")
def ray_serve_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    import ray
    from ray import serve

    port, haproxy_stats, haproxy_metrics = free_ports(3)
    # A short temp path: Ray's unix socket paths must stay under 108 characters.
    temp_dir = tmp_path_factory.mktemp("ray")
    env = {
        "RAY_AUTH_MODE": "disabled",
        # Tests redeploy and shut down often: no 30 s load-balancer drain per replica.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
        **fast_path_env(haproxy_ports=(haproxy_stats, haproxy_metrics)),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(temp_dir))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})

        def deploy(args: dict[str, Any]) -> str:
            serve.run(build_app(args), name="foldgate", route_prefix="/")
            return f"http://127.0.0.1:{port}"

        yield deploy
    finally:
        serve.shutdown()
        ray.shutdown()
