"""Keeping a context within a token limit: one mechanism, three callers.

Every bound on a context is a CliffCompaction at a limit:

- a token budget (the configured one, or a tenant's) bounds a spec that holds a cliff;
- the context guard's limit, derived from the replicas' window, bounds the spec with a
  cliff put outermost (``bounded``);
- a replica that still refuses a context as too long gets the cliff's overflow ladder over
  what was rendered (``overflow_ladder``).

``Renderers`` is the one cache of built renderers, by (tenant, spec, fold mode, limit), for
the first two: a session whose limit stays keeps its renderer, and with it its cache. The
tenant keys it too: a hit saves building a renderer (a few hundred microseconds), which
would tell one tenant which strategies and limits another one uses.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.fold.renderer import Rendered, Renderer
from gateway.fold.spec import StrategySpec, make_renderer, parse_spec
from gateway.lru import LRU
from gateway.transcript import Transcript

# The ladder's cliff: the threshold only decides unforced compactions; the ladder ignores it.
UNBOUNDED_TOKENS = 1 << 40
# Renderers kept built: one per (spec, fold mode, limit) in use, guarded sessions included.
BUILT_RENDERERS = 4096


def bounded(spec: str | StrategySpec) -> StrategySpec:
    """``spec`` with a cliff outermost (itself when it already ends with one)."""
    return parse_spec(spec).with_outer("cliff")


def overflow_ladder(rendered: Transcript) -> Iterator[Rendered]:
    """Successively smaller renderings of ``rendered`` for a "context too long" refusal."""
    return Cliff(threshold=UNBOUNDED_TOKENS).compact_for_overflow(rendered)


class Renderers:
    """Built renderers by (tenant, spec, fold mode, token limit), least recently used out
    first.

    ``fold`` (ReFold's fold mode) only keys a spec that takes it, ``limit`` only one that
    needs a budget. Building raises a ValueError for a bad spec, mode or limit.

    A spec whose cliff is outermost and alone needs the limit is built over the one
    renderer of the rest of the spec, whatever the limit: a session whose limit moves
    (the context guard's calibration) keeps its inner renderings, and its cliff's state
    where another limit decides the same (``Composed``, ``Cliff.carried``).
    """

    def __init__(self, k: int = 3, max_size: int = BUILT_RENDERERS) -> None:
        self.k = k
        self._built: LRU[Renderer] = LRU(max_size)

    def get(
        self, tenant: str, spec: str | StrategySpec, fold: str | None, limit: int | None
    ) -> Renderer:
        spec = parse_spec(spec)
        mode = fold if spec.takes_fold_mode else None
        if not any(s.needs_budget for s in spec.strategies):
            limit = None
        key: Hashable = (tenant, spec, mode, limit)
        renderer = self._built.get(key)
        if renderer is None:
            renderer = self._build(tenant, spec, mode, limit)
            self._built.put(key, renderer)
        return renderer

    def _build(
        self, tenant: str, spec: StrategySpec, mode: str | None, limit: int | None
    ) -> Renderer:
        inner = spec.without_outer()
        if (
            limit is None
            or spec.outermost != "cliff"
            or inner is None
            or any(s.needs_budget for s in inner.strategies)
        ):
            return make_renderer(spec, k=self.k, budget=limit, fold=mode)
        cliff = make_renderer("cliff", k=self.k, budget=limit)
        return Composed(self.get(tenant, inner, mode, None), cliff)

    def bounded(
        self, tenant: str, spec: str | StrategySpec, fold: str | None, limit: int
    ) -> Renderer:
        """The renderer of ``spec`` with a cliff outermost at ``limit``."""
        return self.get(tenant, bounded(spec), fold, limit)
