"""The strategy registry: spec parsing, options, errors."""

from __future__ import annotations

import pytest

import gateway.fold as fold
from gateway.fold import STRATEGIES, Rendered, Renderer, RenderState, RenderStats, make_renderer
from gateway.fold.baselines import Base, Clip, Mask
from gateway.fold.bound import Renderers
from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.fold.refold import ReFold
from gateway.transcript import Message


def tokens(message: Message) -> int:
    return len(message.text)


def test_strategy_names() -> None:
    assert set(STRATEGIES) == {"base", "refold", "cliff", "mask", "clip"}


def test_interface_is_re_exported() -> None:
    from gateway.fold import renderer

    assert {"Renderer", "RenderState", "Rendered", "RenderStats"} <= set(fold.__all__)
    assert (Renderer, RenderState, Rendered, RenderStats) == (
        renderer.Renderer,
        renderer.RenderState,
        renderer.Rendered,
        renderer.RenderStats,
    )


@pytest.mark.parametrize(("spec", "cls"), [("base", Base), ("mask", Mask), ("clip", Clip)])
def test_single_baselines(spec: str, cls: type) -> None:
    renderer = make_renderer(spec)
    assert type(renderer) is cls
    assert renderer.name == spec


def test_refold_gets_k_and_the_token_counter() -> None:
    renderer = make_renderer("refold", k=5, count_tokens=tokens)
    assert isinstance(renderer, ReFold)
    assert (renderer.k, renderer.dedup, renderer.fold, renderer.count_tokens) == (
        5,
        True,
        "auto",
        tokens,
    )
    assert make_renderer("refold", dedup=False).dedup is False


def test_cliff_takes_the_budget_and_options() -> None:
    renderer = make_renderer("cliff", budget=1234, count_tokens=tokens, keep_turns=1)
    assert isinstance(renderer, Cliff)
    assert (renderer.threshold, renderer.keep_turns, renderer.count_tokens) == (1234, 1, tokens)


def test_cliff_without_a_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="budget"):
        make_renderer("cliff")
    with pytest.raises(ValueError, match="budget"):
        make_renderer("refold+cliff")


def test_budget_is_ignored_by_strategies_without_one() -> None:
    assert isinstance(make_renderer("mask", budget=1000), Mask)


def test_compositions_apply_left_to_right() -> None:
    renderer = make_renderer(" refold + cliff ", k=4, budget=900)
    assert isinstance(renderer, Composed)
    assert renderer.name == "refold+cliff"
    assert isinstance(renderer.inner, ReFold) and renderer.inner.k == 4
    assert isinstance(renderer.outer, Cliff) and renderer.outer.threshold == 900

    three = make_renderer("clip+mask+cliff", budget=10)
    assert three.name == "clip+mask+cliff"
    assert isinstance(three, Composed) and isinstance(three.inner, Composed)
    assert (type(three.inner.inner), type(three.inner.outer)) == (Clip, Mask)


def test_options_reach_every_strategy_that_takes_them() -> None:
    renderer = make_renderer("mask+clip", keep_last=2, max_chars=50)
    assert isinstance(renderer, Composed)
    assert renderer.inner.keep_last == renderer.outer.keep_last == 2
    assert renderer.outer.max_chars == 50


@pytest.mark.parametrize("spec", ["", "   ", "rfold", "base+", "cliff+nope", "BASE"])
def test_unknown_or_empty_names_list_the_valid_ones(spec: str) -> None:
    with pytest.raises(ValueError) as err:
        make_renderer(spec, budget=100)
    for name in STRATEGIES:
        assert name in str(err.value)


def test_an_option_no_strategy_takes_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"keep_turns.*not taken.*mask takes keep_last"):
        make_renderer("mask", keep_turns=2)


def test_bad_option_values_are_named() -> None:
    with pytest.raises(ValueError, match="threshold"):
        make_renderer("cliff", budget=-1)


def test_built_renderers_are_kept_per_tenant() -> None:
    # A hit saves building a renderer: shared across tenants it would tell one tenant
    # which strategies and limits another one uses.
    renderers = Renderers()
    mine = renderers.get("acme", "refold+cliff", "auto", 4_000)
    assert renderers.get("acme", "refold+cliff", "auto", 4_000) is mine
    theirs = renderers.get("globex", "refold+cliff", "auto", 4_000)
    assert theirs is not mine
    assert renderers.bounded("globex", "refold", "auto", 4_000) is theirs


def test_a_bounded_spec_shares_its_inner_renderer_across_limits() -> None:
    # A session whose guard limit moves keeps its inner renderings (compose's carried).
    renderers = Renderers()
    first = renderers.bounded("acme", "refold", "auto", 4_000)
    second = renderers.bounded("acme", "refold", "auto", 3_000)
    assert isinstance(first, Composed) and isinstance(second, Composed)
    assert first.inner is second.inner is renderers.get("acme", "refold", "auto", None)
    assert (first.outer.threshold, second.outer.threshold) == (4_000, 3_000)
    # A cliff inside needs the limit too: nothing is shared.
    inner_cliff = renderers.get("acme", "cliff+refold+cliff", "auto", 4_000)
    other = renderers.get("acme", "cliff+refold+cliff", "auto", 3_000)
    assert isinstance(inner_cliff, Composed) and isinstance(other, Composed)
    assert inner_cliff.inner is not other.inner
