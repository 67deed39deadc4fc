"""Context renderers: the strategies, their registry and the spec that names them.

A spec is a strategy name or a ``+``-joined composition applied left to right
(``gateway.fold.spec``). Each strategy module registers itself (``gateway.fold.registry``);
importing it here is its one registration line.
"""

from __future__ import annotations

from gateway.fold import baselines, cliff, progress, refold, supersede  # noqa: F401  (each registers itself)
from gateway.fold.registry import names
from gateway.fold.renderer import Rendered, Renderer, RenderState, RenderStats
from gateway.fold.spec import StrategySpec, make_renderer, parse_spec

__all__ = [
    "STRATEGIES",
    "RenderState",
    "RenderStats",
    "Rendered",
    "Renderer",
    "StrategySpec",
    "make_renderer",
    "parse_spec",
]

STRATEGIES: tuple[str, ...] = names()
