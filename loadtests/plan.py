"""An experiment's cells, from a TOML file of named profiles.

A profile sets run-wide values and lists ``matrix`` blocks; each block is the product of
its list-valued keys (a scalar is a list of one). Keys resolve block -> profile ->
``[defaults]``. A cell is one arm: the gateway with a strategy, a routing policy and a
server (uvicorn or Ray Serve), optionally a named ``variant`` (a table of GatewayConfig
overrides under ``[profiles.<name>.variants]``, written to the cell's gateway config file);
``arm = "vllm_router"`` (vLLM's own router, ``vllm-router`` from the ``peers`` extra, with a
``router_policy``); or ``arm = "no_gateway"`` (the same users straight to the replicas,
round-robin per request); ``users`` concurrent sessions; a KV pool per replica; a
``think_time`` (``0``: saturation; ``MEDIAN:SIGMA``: the recorded gap where a trajectory
logged one, else a lognormal draw); and a load: ``sessions`` (every user replays one
session, all start together; the cell ends when all are done: fixed work) or ``steps`` (a
step load over ``step_users``, each stage ``step_seconds`` long, users replaying session
after session: fixed time).

Cells run grouped by KV pool (in the order each pool first appears): cells that share a
pool share the replicas, with vLLM's prefix cache reset between them, unless the profile
says ``fresh_replicas = true``. ``runs = N`` repeats every cell N times, each pool's cells
in reverse order on every other run, so warm-up and the machine's drift favour no arm.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from deploy.cpu.replicas import parse_bytes
from gateway.config import GatewayConfig
from offline.think_time import ThinkTime

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = Path(__file__).with_name("experiments.toml")
ARMS = ("gateway", "no_gateway", "vllm_router")
ROUTINGS = ("sticky", "sticky_cost", "round_robin", "least_loaded")
# vllm-router's --policy choices (vllm_router/router_args.py, 0.1.17) but random.
ROUTER_POLICIES = (
    "cache_aware", "consistent_hash", "sticky_least_loaded", "kv_aware", "power_of_two",
    "round_robin",
)  # fmt: skip
SERVERS = ("uvicorn", "ray")
LOADS = ("sessions", "steps")
_AXES = (
    "arm", "strategy", "routing", "router_policy", "variant", "users", "kv_cache_bytes",
    "server", "load", "think_time",
)  # fmt: skip
# A GatewayConfig override's value: what a TOML table written back as TOML can hold.
Override = tuple[str, str | int | float | bool]


class PlanError(ValueError):
    """A config that does not describe a runnable experiment."""


@dataclass(frozen=True)
class Settings:
    """Run-wide values of a profile."""

    trajectories: tuple[str, ...]
    model: str
    replicas: int
    max_steps: int
    max_tokens_cap: int
    think_time: str
    block_size: int
    max_model_len: int
    budget: int
    run_time_s: float
    scrape_interval_s: float
    step_users: tuple[int, ...]
    step_seconds: float
    fresh_replicas: bool = False
    cost_model: str = "cpu-tiny"
    runs: int = 1
    # Longest recorded think time waited (Locust's --think-cap), seconds.
    think_cap_s: float = 60.0
    # Replicas publish vLLM's KV events (ZMQ; deploy.cpu.vllm_server.kv_events_args), which
    # vllm-router's kv_aware and the gateway's KV mechanisms subscribe to.
    kv_events: bool = False
    # Capacity (step loads): the most users whose stage kept client TTFT p95 under this.
    ttft_p95_bound_ms: float = 2000.0
    # The variant that stands for foldgate's default in the answers (e.g. its KV mechanisms).
    default_variant: str = ""

    def trajectory_paths(self) -> list[Path]:
        return [
            p if p.is_absolute() else (ROOT / p).resolve() for p in map(Path, self.trajectories)
        ]


@dataclass(frozen=True)
class Cell:
    arm: str
    strategy: str
    routing: str
    users: int
    kv_cache_bytes: int
    server: str
    load: str
    router_policy: str = "-"
    variant: str = ""
    overrides: tuple[Override, ...] = ()
    think_time: str = "0"

    @property
    def name(self) -> str:
        kv = f"kv{self.kv_cache_bytes // 2**20}M"
        if self.arm == "no_gateway":
            parts = ["no-gateway", "rr"]
        elif self.arm == "vllm_router":
            parts = ["vllm-router", self.router_policy.replace("_", "-")]
        else:
            parts = [self.strategy.replace("+", "-"), self.routing.replace("_", "-")]
            if self.server == "ray":
                parts.append("ray")
            if self.variant:
                parts.append(self.variant.replace("_", "-"))
        load = f"u{self.users}" if self.load == "sessions" else "steps"
        think = [] if self.think_time in ("0", "0.0") else ["think" + self.think_time.split(":")[0]]
        return "_".join([*parts, load, *think, kv])

    @property
    def foldgate(self) -> bool:
        return self.arm == "gateway"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["overrides"] = dict(self.overrides)
        return {"cell": self.name, **data}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    settings: Settings
    cells: tuple[Cell, ...]


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def load_profile(name: str, path: Path = DEFAULT_CONFIG) -> Profile:
    try:
        config = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PlanError(f"{path}: {exc}") from exc
    profiles = config.get("profiles", {})
    if name not in profiles:
        raise PlanError(f"{path}: no profile {name!r} (profiles: {', '.join(sorted(profiles))})")
    defaults: Mapping[str, Any] = config.get("defaults", {})
    profile: Mapping[str, Any] = profiles[name]
    merged = {**defaults, **{k: v for k, v in profile.items() if k != "matrix"}}
    settings = _settings(merged, path)
    variants = _variants(profile.get("variants", {}), path)
    cells: list[Cell] = []
    for block in profile.get("matrix", []):
        values = {axis: _listed(block.get(axis, merged.get(axis))) for axis in _AXES}
        for combo in itertools.product(*(values[a] for a in _AXES)):
            cell = _cell(dict(zip(_AXES, combo, strict=True)), variants, path)
            if cell not in cells:
                cells.append(cell)
    if not cells:
        raise PlanError(f"{path}: profile {name!r} has no cells (add [[profiles.{name}.matrix]])")
    pools = list(dict.fromkeys(c.kv_cache_bytes for c in cells))
    cells.sort(key=lambda c: pools.index(c.kv_cache_bytes))  # stable: one replica start a pool
    return Profile(name, str(profile.get("description", "")), settings, tuple(cells))


def select(profile: Profile, patterns: Sequence[str]) -> Profile:
    """The profile with only the cells whose names match a shell-style pattern
    (``base_*``, ``*_kv10M``); a pattern that matches nothing is an error."""
    unmatched = [p for p in patterns if not any(fnmatch(c.name, p) for c in profile.cells)]
    if unmatched:
        names = ", ".join(c.name for c in profile.cells)
        raise PlanError(f"no cell of {profile.name!r} matches {', '.join(unmatched)} ({names})")
    cells = tuple(c for c in profile.cells if any(fnmatch(c.name, p) for p in patterns))
    return replace(profile, cells=cells)


def _settings(values: Mapping[str, Any], path: Path) -> Settings:
    try:
        settings = Settings(
            trajectories=tuple(_listed(values["trajectories"])),
            model=str(values["model"]),
            replicas=int(values["replicas"]),
            max_steps=int(values.get("max_steps", 0)),
            max_tokens_cap=int(values.get("max_tokens_cap", 0)),
            think_time=str(values.get("think_time", "0")),
            block_size=int(values["block_size"]),
            max_model_len=int(values["max_model_len"]),
            budget=int(values.get("budget", 0)),
            run_time_s=float(values["run_time_s"]),
            scrape_interval_s=float(values.get("scrape_interval_s", 3)),
            step_users=tuple(int(u) for u in _listed(values.get("step_users", [1]))),
            step_seconds=float(values.get("step_seconds", 30)),
            fresh_replicas=bool(values.get("fresh_replicas", False)),
            cost_model=str(values.get("cost_model", "cpu-tiny")),
            runs=int(values.get("runs", 1)),
            think_cap_s=float(values.get("think_cap_s", 60.0)),
            kv_events=bool(values.get("kv_events", False)),
            ttft_p95_bound_ms=float(values.get("ttft_p95_bound_ms", 2000.0)),
            default_variant=str(values.get("default_variant", "")),
        )
    except KeyError as exc:
        raise PlanError(f"{path}: missing setting {exc.args[0]!r}") from exc
    if settings.replicas < 1 or not settings.step_users or min(settings.step_users) < 1:
        raise PlanError(f"{path}: replicas and step_users must be positive")
    if settings.runs < 1:
        raise PlanError(f"{path}: runs must be at least 1, got {settings.runs}")
    return settings


def _variants(table: Mapping[str, Any], path: Path) -> dict[str, tuple[Override, ...]]:
    """``[profiles.<name>.variants]``: variant name -> its GatewayConfig overrides (scalars:
    they are written to a TOML file). Whether this gateway has those fields is checked
    before a run (``unknown_overrides``), not here: a profile may name the fields of a
    gateway other than the one installed."""
    out: dict[str, tuple[Override, ...]] = {}
    for name, overrides in table.items():
        if not isinstance(overrides, Mapping):
            raise PlanError(f"{path}: variant {name!r} must be a table of GatewayConfig fields")
        for key, value in overrides.items():
            if not isinstance(value, str | int | float | bool):
                raise PlanError(f"{path}: variant {name!r}: {key} must be a scalar")
        out[name] = tuple(sorted(overrides.items()))
    return out


def unknown_overrides(profile: Profile) -> list[str]:
    """``cell: field`` for every override that this gateway's GatewayConfig lacks (its
    ``foldgate serve`` would refuse the config file)."""
    known = set(GatewayConfig.__dataclass_fields__)
    return [f"{c.name}: {key}" for c in profile.cells for key, _ in c.overrides if key not in known]


def _cell(values: dict[str, Any], variants: Mapping[str, tuple[Override, ...]], path: Path) -> Cell:
    arm = values["arm"] or "gateway"
    checks = ((arm, ARMS, "arm"), (values["load"], LOADS, "load"))
    if arm == "gateway":
        checks += ((values["routing"], ROUTINGS, "routing"), (values["server"], SERVERS, "server"))
    if arm == "vllm_router":
        checks += ((values["router_policy"], ROUTER_POLICIES, "router_policy"),)
    for value, allowed, key in checks:
        if value not in allowed:
            raise PlanError(f"{path}: {key} must be one of {', '.join(allowed)}, got {value!r}")
    variant = str(values["variant"] or "") if arm == "gateway" else ""
    if variant and variant not in variants:
        raise PlanError(f"{path}: no variant {variant!r} (variants: {', '.join(variants)})")
    if arm != "gateway":  # no strategy, no foldgate routing policy: the peer's own
        values.update(strategy="-", routing="-", server="-")
    if arm == "no_gateway":
        values.update(routing="round_robin")
    if arm != "vllm_router":
        values["router_policy"] = "-"
    if values["load"] == "steps":  # the user count follows the profile's step_users
        values["users"] = 0
    try:  # refuse a bad spec before anything starts
        ThinkTime.parse(str(values["think_time"] or "0"))
    except ValueError as exc:
        raise PlanError(f"{path}: {exc}") from exc
    return Cell(
        arm=arm,
        strategy=str(values["strategy"]),
        routing=str(values["routing"]),
        users=int(values["users"]),
        kv_cache_bytes=parse_bytes(values["kv_cache_bytes"]),
        server=str(values["server"]),
        load=str(values["load"]),
        router_policy=str(values["router_policy"]),
        variant=variant,
        overrides=variants.get(variant, ()),
        think_time=str(values["think_time"] or "0"),
    )
