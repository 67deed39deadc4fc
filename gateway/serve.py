"""``foldgate serve``: run the gateway with uvicorn, or as a Ray Serve application."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click

from gateway.config import GatewayConfig
from router import POLICY_NAMES

DEFAULT_PORT = 8080


@click.command("serve")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, path_type=Path),
    help="TOML file with GatewayConfig fields (see docs/configuration.md).",
)
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    metavar="URL",
    help="vLLM replica base URL, e.g. http://127.0.0.1:8000 (repeat for several).",
)
@click.option(
    "--replica-dns",
    metavar="HOST:PORT",
    help="Headless service whose A records are the replicas (Kubernetes).",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="redis://host:6379/0 for Redis; default: the embedded SQLite store.",
)
@click.option("--strategy", help="Default context strategy: base, refold, cliff, refold+cliff, ...")
@click.option(
    "--fold",
    type=click.Choice(["auto", "on", "off"]),
    help="ReFold's fold protocol: auto (ask the model, stop after two ignored asks; default), "
    "on (ask in the system prompt from the start), off (deduplicate only).",
)
@click.option(
    "--policy",
    type=click.Choice(POLICY_NAMES),
    help="How sessions are routed to replicas.",
)
@click.option("--budget", type=int, help="Token budget for cliff (and refold+cliff).")
@click.option(
    "--upstream-model", help="Model name sent upstream (default: what the replicas serve)."
)
@click.option(
    "--ui",
    is_flag=True,
    default=None,
    help="Serve the inspector page at /ui (off by default; config field 'ui').",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Run as a Ray Serve application (needs the 'ray' extra) instead of uvicorn.",
)
@click.option(
    "--ray-replicas",
    default=1,
    show_default=True,
    type=int,
    help="Gateway replicas under Ray Serve.",
)
def serve(
    config_path: Path | None,
    replicas: tuple[str, ...],
    replica_dns: str | None,
    store_url: str | None,
    strategy: str | None,
    fold: str | None,
    policy: str | None,
    budget: int | None,
    upstream_model: str | None,
    ui: bool | None,
    host: str,
    port: int,
    use_ray: bool,
    ray_replicas: int,
) -> None:
    """Serve the OpenAI (/v1/chat/completions) and Anthropic (/v1/messages) APIs.

    Point a harness's base URL at http://HOST:PORT (OpenAI SDKs: .../v1). Sessions are kept
    in the store, contexts are rendered with the strategy, and requests are routed to the
    replicas. Flags override FOLDGATE_* variables, which override the config file.
    """
    overrides = {
        "replicas": replicas or None,
        "replica_dns": replica_dns,
        "store_url": store_url,
        "strategy": strategy,
        "fold": fold,
        "policy": policy,
        "budget": budget,
        "upstream_model": upstream_model,
        "ui": ui,
    }
    try:
        config = GatewayConfig.load(config_path, **overrides)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from exc
    if not config.replicas and not config.replica_dns:
        raise click.UsageError("no replicas: give --replica URL (repeatable) or --replica-dns")
    upstreams = ",".join(config.replicas) or config.replica_dns
    click.echo(
        f"foldgate on http://{host}:{port}  strategy={config.strategy} policy={config.policy} "
        f"store={redact_url(config.store_url) if config.store_url else 'sqlite (embedded)'} "
        f"replicas={upstreams}"
    )
    if config.ui:
        click.echo(f"inspector on http://{host}:{port}/ui")
    if use_ray:
        _serve_ray(config_path, overrides, host, port, ray_replicas)
        return
    import uvicorn

    from gateway.app import create_app
    from gateway.gc_tuning import tune_for_serving
    from gateway.http_server import uvicorn_config
    from gateway.open_files import open_files_line

    click.echo(open_files_line(config))
    app = create_app(config)
    tune_for_serving()
    uvicorn.Server(uvicorn_config(app, config, host, port)).run()


def redact_url(url: str) -> str:
    """``url`` with its password (``redis://user:secret@host``) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:***"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


def _serve_ray(
    config_path: Path | None, overrides: dict, host: str, port: int, ray_replicas: int
) -> None:
    try:
        import ray
        from ray import serve as ray_serve
    except ImportError as exc:
        raise click.UsageError("--ray needs Ray Serve: pip install 'foldgate[ray]'") from exc
    from gateway.serve_ray import build_app, fast_path_env

    args = {k: v for k, v in overrides.items() if v is not None}
    if config_path:
        args["config"] = str(config_path)
    args["num_replicas"] = ray_replicas
    try:
        app = build_app(args)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from exc
    # Before ray.init: the cluster's processes inherit this environment. Explicit settings
    # in the caller's environment win.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    for name, value in fast_path_env().items():
        os.environ.setdefault(name, value)
    ray.init(include_dashboard=False)
    # After ray.init, which installs its own SIGTERM handler: stop Serve and Ray cleanly.
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        ray_serve.start(http_options={"host": host, "port": port})
        ray_serve.run(app, name="foldgate", route_prefix="/")
        while not stop["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        ray_serve.shutdown()
        ray.shutdown()
