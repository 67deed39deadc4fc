"""An experiment's cells, from a TOML file of named profiles.

A profile sets run-wide values and lists ``matrix`` blocks; each block is the product of
its list-valued keys (a scalar is a list of one). Keys resolve block -> profile ->
``[defaults]``. A cell is one arm: the gateway with a strategy, a routing policy and a
server (uvicorn or Ray Serve), or ``arm = "no_gateway"`` (the same users straight to the
replicas, round-robin per request); ``users`` concurrent sessions; a KV pool per replica;
and a load: ``sessions`` (every user replays one session, all start together; the cell
ends when all are done: fixed work) or ``steps`` (a step load over ``step_users``, each
stage ``step_seconds`` long, users replaying session after session: fixed time).

Cells run grouped by KV pool (in the order each pool first appears): cells that share a
pool share the replicas, with vLLM's prefix cache reset between them, unless the profile
says ``fresh_replicas = true``.
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

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = Path(__file__).with_name("experiments.toml")
ARMS = ("gateway", "no_gateway")
ROUTINGS = ("sticky", "sticky_cost", "round_robin", "least_loaded")
SERVERS = ("uvicorn", "ray")
LOADS = ("sessions", "steps")
_AXES = ("arm", "strategy", "routing", "users", "kv_cache_bytes", "server", "load")


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

    @property
    def name(self) -> str:
        kv = f"kv{self.kv_cache_bytes // 2**20}M"
        if self.arm == "no_gateway":
            parts = ["no-gateway", "rr"]
        else:
            parts = [self.strategy.replace("+", "-"), self.routing.replace("_", "-")]
            if self.server == "ray":
                parts.append("ray")
        load = f"u{self.users}" if self.load == "sessions" else "steps"
        return "_".join([*parts, load, kv])

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.name, **asdict(self)}


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
    cells: list[Cell] = []
    for block in profile.get("matrix", []):
        values = {axis: _listed(block.get(axis, merged.get(axis))) for axis in _AXES}
        for combo in itertools.product(*(values[a] for a in _AXES)):
            cell = _cell(dict(zip(_AXES, combo, strict=True)), path)
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
        )
    except KeyError as exc:
        raise PlanError(f"{path}: missing setting {exc.args[0]!r}") from exc
    if settings.replicas < 1 or not settings.step_users or min(settings.step_users) < 1:
        raise PlanError(f"{path}: replicas and step_users must be positive")
    return settings


def _cell(values: dict[str, Any], path: Path) -> Cell:
    arm = values["arm"] or "gateway"
    checks = ((arm, ARMS, "arm"), (values["load"], LOADS, "load"))
    if arm == "gateway":
        checks += ((values["routing"], ROUTINGS, "routing"), (values["server"], SERVERS, "server"))
    for value, allowed, key in checks:
        if value not in allowed:
            raise PlanError(f"{path}: {key} must be one of {', '.join(allowed)}, got {value!r}")
    if arm == "no_gateway":  # no strategy, no routing policy: a plain round-robin
        values.update(strategy="-", routing="round_robin", server="-")
    if values["load"] == "steps":  # the user count follows the profile's step_users
        values["users"] = 0
    return Cell(
        arm=arm,
        strategy=str(values["strategy"]),
        routing=str(values["routing"]),
        users=int(values["users"]),
        kv_cache_bytes=parse_bytes(values["kv_cache_bytes"]),
        server=str(values["server"]),
        load=str(values["load"]),
    )
