"""The strategy registry: each strategy module registers itself once, by name.

A registration says what the gateway needs to know of a strategy without knowing its
class: how to build it (its constructor, and which of the gateway's own settings it takes:
ReFold's chunk size, the token budget, the token counter), whether it takes ReFold's fold
mode, and how much memory its per-session cache keeps per byte of history text. Adding a
strategy is one new module calling ``register`` and one import line in ``gateway.fold``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.fold.renderer import Renderer
from gateway.tokens import TokenCount, estimate_tokens


@dataclass(frozen=True, slots=True)
class Settings:
    """The gateway's settings a strategy may take: ReFold's chunk size ``k`` and fold mode
    ``fold`` (None: its default), the token ``budget`` a cliff compacts at, and the
    ``count_tokens`` every count is made with."""

    k: int = 3
    budget: int | None = None
    count_tokens: TokenCount = estimate_tokens
    fold: str | None = None


@dataclass(frozen=True, slots=True)
class Strategy:
    """One registered strategy.

    ``build``: its constructor; its parameters are the options it takes. ``settings``: the
    constructor arguments it takes from the gateway's ``Settings`` (options given by name
    override them). ``needs_budget``: refused without a token budget. ``takes_fold_mode``:
    it takes ReFold's fold mode (``Settings.fold``; the fold header only matters then).
    ``cache_bytes_per_text_byte``: what its per-session cache keeps alive per byte of the
    history's text, and ``cache_bytes_per_message`` per message however short its text (its
    objects) (both measured; tests/gateway/test_lru.py fails when they drift).
    """

    name: str
    build: Callable[..., Renderer]
    settings: Callable[[Settings], Mapping[str, Any]] = lambda _: {}
    needs_budget: bool = False
    takes_fold_mode: bool = False
    cache_bytes_per_text_byte: float = 0.0
    cache_bytes_per_message: int = 0
    options: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", frozenset(inspect.signature(self.build).parameters))


_REGISTERED: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    """Add ``strategy`` under its name (once: a second registration of a name is an error)."""
    if strategy.name in _REGISTERED:
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
    if not strategy.name.isidentifier():
        raise ValueError(f"strategy name {strategy.name!r} must be an identifier")
    _REGISTERED[strategy.name] = strategy
    return strategy


def names() -> tuple[str, ...]:
    """The registered strategies' names, in registration order."""
    return tuple(_REGISTERED)


def lookup(name: str) -> Strategy | None:
    return _REGISTERED.get(name)
