"""Context renderers and the registry that builds them from a strategy spec.

A spec is a strategy name or a ``+``-joined composition applied left to right:
``refold+cliff`` renders with ReFold, then lets CliffCompaction truncate what ReFold
rendered once it still crosses the budget (see ``compose.py`` for the caveats).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from gateway.fold.baselines import Base, Clip, Mask
from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.fold.renderer import (
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    TokenCount,
    estimate_tokens,
)

__all__ = [
    "STRATEGIES",
    "RenderState",
    "RenderStats",
    "Rendered",
    "Renderer",
    "make_renderer",
]

STRATEGIES: tuple[str, ...] = ("base", "refold", "cliff", "mask", "clip")


def _refold_class() -> type[Renderer]:
    # Imported on use: refold.py is another module's job and may not be importable yet.
    from gateway.fold.refold import ReFold

    return ReFold


def _classes() -> dict[str, Callable[[], type[Renderer]]]:
    return {
        "base": lambda: Base,
        "refold": _refold_class,
        "cliff": lambda: Cliff,
        "mask": lambda: Mask,
        "clip": lambda: Clip,
    }


def make_renderer(
    spec: str,
    *,
    k: int = 3,
    budget: int | None = None,
    count_tokens: TokenCount = estimate_tokens,
    **options: Any,
) -> Renderer:
    """Build the renderer ``spec`` names (``base``, ``refold``, ``cliff``, ``mask``,
    ``clip``, or ``a+b`` compositions).

    ``k`` is ReFold's chunk size, ``budget`` the token threshold a ``cliff`` needs.
    ``options`` go to every strategy in the spec whose constructor takes them (for example
    ``keep_turns=1``, ``assistant_cap=300``, ``dedup=False``); one that no strategy in the
    spec takes is an error.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty strategy spec; expected one of {', '.join(STRATEGIES)}")
    names = [part.strip() for part in spec.split("+")]
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {name!r} in {spec!r}; valid ones: {', '.join(STRATEGIES)} "
                "(compose them with '+', e.g. 'refold+cliff')"
            )
    if "cliff" in names and budget is None:
        raise ValueError(f"strategy {spec!r} uses cliff, which needs a token budget (budget=...)")
    classes = {name: _classes()[name]() for name in names}
    accepted = {name: set(inspect.signature(cls).parameters) for name, cls in classes.items()}
    unused = sorted(set(options) - set().union(*accepted.values()))
    if unused:
        raise ValueError(
            f"option(s) {', '.join(unused)} not taken by any strategy in {spec!r}; "
            + "; ".join(f"{n} takes {', '.join(sorted(a)) or 'none'}" for n, a in accepted.items())
        )
    renderers = [
        _build(name, classes[name], accepted[name], k, budget, count_tokens, options)
        for name in names
    ]
    renderer = renderers[0]
    for outer in renderers[1:]:
        renderer = Composed(renderer, outer)
    return renderer


def _build(
    name: str,
    cls: type[Renderer],
    accepted: set[str],
    k: int,
    budget: int | None,
    count_tokens: TokenCount,
    options: dict[str, Any],
) -> Renderer:
    kwargs = {key: value for key, value in options.items() if key in accepted}
    if name == "refold":
        kwargs = {"k": k, "dedup": True, "count_tokens": count_tokens} | kwargs
    elif name == "cliff":
        kwargs = {"threshold": budget, "count_tokens": count_tokens} | kwargs
    return cls(**kwargs)
