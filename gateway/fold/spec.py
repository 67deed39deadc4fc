"""A strategy spec: a strategy name or a ``+``-joined composition, parsed once.

``refold+cliff`` renders with ReFold and compacts where CliffCompaction alone compacts the
history, keeping ReFold's rendering of the tail (see ``compose.py`` for why and the caveats). A spec
comes from clients' headers, so it is bounded before it is split: at most
``MAX_SPEC_CHARS`` characters and ``MAX_SPEC_PARTS`` parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.fold.compose import Composed
from gateway.fold.registry import Settings, Strategy, lookup, names
from gateway.fold.renderer import Renderer
from gateway.tokens import TokenCount, estimate_tokens

MAX_SPEC_CHARS = 64
MAX_SPEC_PARTS = 4


@dataclass(frozen=True, slots=True)
class StrategySpec:
    """Registered strategy names, applied left to right; ``str(spec)`` is canonical."""

    parts: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.parts) <= MAX_SPEC_PARTS:
            raise ValueError(
                f"a strategy spec has 1 to {MAX_SPEC_PARTS} parts, got {len(self.parts)}"
            )
        for name in self.parts:
            if lookup(name) is None:
                raise ValueError(
                    f"unknown strategy {name!r} in {str(self)!r}; valid ones: {_valid()} "
                    "(compose them with '+', e.g. 'refold+cliff')"
                )

    def __str__(self) -> str:
        return "+".join(self.parts)

    def has(self, name: str) -> bool:
        return name in self.parts

    @property
    def outermost(self) -> str:
        return self.parts[-1]

    def without_outer(self) -> StrategySpec | None:
        """This spec without its outermost part; None for a single strategy."""
        return StrategySpec(self.parts[:-1]) if len(self.parts) > 1 else None

    def with_outer(self, name: str) -> StrategySpec:
        """This spec with ``name`` applied last (itself when ``name`` already is)."""
        return self if self.outermost == name else StrategySpec((*self.parts, name))

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        return tuple(lookup(name) for name in self.parts)  # type: ignore[misc]

    @property
    def takes_fold_mode(self) -> bool:
        """Whether a part takes ReFold's fold mode (option ``fold``)."""
        return any(s.takes_fold_mode for s in self.strategies)

    @property
    def cache_bytes_per_text_byte(self) -> float:
        """What the session's renderer cache keeps per byte of history text: each part's."""
        return sum(s.cache_bytes_per_text_byte for s in self.strategies)

    @property
    def cache_bytes_per_message(self) -> int:
        """What the session's renderer cache keeps per history message: each part's."""
        return sum(s.cache_bytes_per_message for s in self.strategies)


def _valid() -> str:
    return ", ".join(names())


def parse_spec(text: str | StrategySpec) -> StrategySpec:
    """The spec ``text`` names (a spec is returned as it is); a ValueError saying why not."""
    if isinstance(text, StrategySpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty strategy spec; expected one of {_valid()}")
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(
            f"strategy spec of {len(text)} characters; at most {MAX_SPEC_CHARS} are accepted"
        )
    if text.count("+") >= MAX_SPEC_PARTS:
        raise ValueError(
            f"strategy spec of {text.count('+') + 1} parts; at most {MAX_SPEC_PARTS} compose"
        )
    parts = tuple(part.strip() for part in text.split("+"))
    for name in parts:
        if lookup(name) is None:
            raise ValueError(
                f"unknown strategy {name!r} in {text!r}; valid ones: {_valid()} "
                "(compose them with '+', e.g. 'refold+cliff')"
            )
    return StrategySpec(parts)


def make_renderer(
    spec: str | StrategySpec,
    *,
    k: int = 3,
    budget: int | None = None,
    count_tokens: TokenCount = estimate_tokens,
    fold: str | None = None,
    **options: Any,
) -> Renderer:
    """Build the renderer ``spec`` names (see ``gateway.fold.STRATEGIES``; ``a+b``
    compositions apply left to right).

    ``k`` and ``fold`` are ReFold's chunk size and fold mode (None: its default), ``budget``
    the token threshold a ``cliff`` needs; a strategy that does not take one ignores it.
    ``options`` go to every strategy in the spec whose constructor takes them (for example
    ``keep_turns=1``, ``assistant_cap=300``, ``dedup=False``); one that no strategy in the
    spec takes is an error.
    """
    spec = parse_spec(spec)
    strategies = spec.strategies
    for strategy in strategies:
        if strategy.needs_budget and budget is None:
            raise ValueError(
                f"strategy {str(spec)!r} uses {strategy.name}, which needs a token budget "
                "(budget=...)"
            )
    unused = sorted(set(options) - set().union(*(s.options for s in strategies)))
    if unused:
        raise ValueError(
            f"option(s) {', '.join(unused)} not taken by any strategy in {str(spec)!r}; "
            + "; ".join(
                f"{s.name} takes {', '.join(sorted(s.options)) or 'none'}" for s in strategies
            )
        )
    settings = Settings(k=k, budget=budget, count_tokens=count_tokens, fold=fold)
    renderers = [
        s.build(**(dict(s.settings(settings)) | {o: options[o] for o in s.options & set(options)}))
        for s in strategies
    ]
    renderer = renderers[0]
    for outer in renderers[1:]:
        renderer = Composed(renderer, outer)
    return renderer
