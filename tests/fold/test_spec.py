"""The strategy spec: parsed once, canonical, bounded; the registry behind it."""

from __future__ import annotations

import pytest

from gateway.fold import STRATEGIES, StrategySpec, parse_spec
from gateway.fold.baselines import Base
from gateway.fold.registry import Strategy, lookup, register
from gateway.fold.spec import MAX_SPEC_CHARS, MAX_SPEC_PARTS


def test_a_spec_is_canonical_hashable_and_says_what_it_holds() -> None:
    spec = parse_spec(" refold + cliff ")
    assert str(spec) == "refold+cliff" and spec.parts == ("refold", "cliff")
    assert spec == parse_spec("refold+cliff") and hash(spec) == hash(parse_spec("refold+cliff"))
    assert spec.has("refold") and spec.has("cliff") and not spec.has("mask")
    assert spec.outermost == "cliff" and parse_spec(spec) is spec
    assert spec.with_outer("cliff") is spec
    assert str(parse_spec("base").with_outer("cliff")) == "base+cliff"
    with pytest.raises(AttributeError):
        spec.parts = ("base",)  # type: ignore[misc]


def test_what_the_gateway_needs_to_know_comes_from_the_registrations() -> None:
    assert parse_spec("refold+cliff").takes_fold_mode
    assert not parse_spec("mask+cliff").takes_fold_mode
    refold, cliff = lookup("refold"), lookup("cliff")
    assert refold is not None and cliff is not None
    both = parse_spec("refold+cliff").cache_bytes_per_text_byte
    assert both == refold.cache_bytes_per_text_byte + cliff.cache_bytes_per_text_byte > 0
    assert parse_spec("base").cache_bytes_per_text_byte == 0
    assert cliff.needs_budget and not refold.needs_budget


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("+" * 10_000, str(MAX_SPEC_CHARS)),
        ("refold+" * 1_000 + "cliff", str(MAX_SPEC_CHARS)),
        ("+".join(["base"] * (MAX_SPEC_PARTS + 1)), str(MAX_SPEC_PARTS)),
        ("a+" * 20, str(MAX_SPEC_PARTS)),
    ],
)
def test_hostile_specs_are_refused_before_they_are_split(text: str, bound: str) -> None:
    with pytest.raises(ValueError, match=bound) as err:
        parse_spec(text)
    assert len(str(err.value)) < 200  # the text itself is not echoed back


def test_a_spec_of_the_most_parts_is_accepted() -> None:
    assert len(parse_spec("+".join(["base"] * MAX_SPEC_PARTS)).parts) == MAX_SPEC_PARTS


@pytest.mark.parametrize("text", ["", "  ", "refold+", "nope", "BASE", 7, None])
def test_specs_naming_no_strategy_list_the_valid_ones(text: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_spec(text)  # type: ignore[arg-type]
    assert all(name in str(err.value) for name in STRATEGIES)


def test_a_spec_built_directly_is_checked_too() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        StrategySpec(("refold", "nope"))
    with pytest.raises(ValueError, match=str(MAX_SPEC_PARTS)):
        StrategySpec(())


def test_a_name_registers_once() -> None:
    with pytest.raises(ValueError, match="twice"):
        register(Strategy("base", Base))
    with pytest.raises(ValueError, match="identifier"):
        register(Strategy("a+b", Base))
