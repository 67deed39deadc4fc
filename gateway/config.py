"""Gateway configuration: one dataclass, filled from a TOML file, FOLDGATE_* env, or flags.

Every field has a default that works on one host: the embedded SQLite store, ReFold, sticky
routing, one default tenant.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class GatewayConfig:
    store_url: str | None = None
    """``redis://...`` for Redis; ``sqlite:///path`` or unset for the embedded SQLite store."""
    replicas: tuple[str, ...] = ()
    """Base URLs of the vLLM replicas (``http://host:port``)."""
    replica_dns: str | None = None
    """``host:port`` of a headless service whose A records are the replicas."""
    policy: str = "sticky"
    strategy: str = "refold"
    fold: str = "auto"
    """ReFold's fold protocol: "auto" asks the model and stops after two ignored asks,
    "on" asks in the system prompt from the start (the paper), "off" only deduplicates."""
    k: int = 3
    budget: int | None = None
    session_header: str = "x-session-id"
    strategy_header: str = "x-foldgate-strategy"
    fold_header: str = "x-foldgate-fold"
    api_keys: dict[str, str] = field(default_factory=dict)
    """API key -> tenant. Empty: every request belongs to the default tenant."""
    tenant_fold: dict[str, str] = field(default_factory=dict)
    """Tenant -> ReFold fold mode, for tenants whose agents should not be asked (or should
    be asked from the start); the ``x-foldgate-fold`` header overrides it per request."""
    default_tenant: str = DEFAULT_TENANT
    upstream_model: str | None = None
    """Model name sent upstream; unset: the one model the replicas serve, else the client's."""
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    max_restores: int = 3
    max_attempts: int = 3
    assignment_ttl_s: float = 3600.0
    rehome_margin: float = 8.0
    probe_interval_s: float = 2.0
    ui: bool = False
    """Serve the inspector page at ``/ui`` (sessions, and what the model saw at each step)."""

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
        """File (TOML), then ``FOLDGATE_*`` environment variables, then explicit overrides."""
        values: dict[str, Any] = {}
        if path:
            values.update(tomllib.loads(Path(path).read_text()))
        known = {f.name: f for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown config keys in {path}: {', '.join(sorted(unknown))}")
        for name in known:
            env = os.environ.get(f"FOLDGATE_{name.upper()}")
            if env is not None:
                values[name] = _from_env(name, env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "replicas" in values:
            values["replicas"] = tuple(u.rstrip("/") for u in values["replicas"])
        return cls(**values)


def _from_env(name: str, raw: str) -> Any:
    if name == "replicas":
        return tuple(u for u in raw.split(",") if u)
    if name in {"api_keys", "tenant_fold"}:
        return dict(pair.split("=", 1) for pair in raw.split(",") if pair)
    if name in {"k", "budget", "max_body_bytes", "max_restores", "max_attempts"}:
        return int(raw)
    if name == "ui":
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if name.endswith("_s") or name == "rehome_margin":
        return float(raw)
    return raw
