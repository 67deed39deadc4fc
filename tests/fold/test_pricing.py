"""ReFold's rewrite pricing: a saving must beat the re-prefill it causes."""

from __future__ import annotations

import pytest

from gateway.fold.pricing import (
    CACHED_TOKEN_WEIGHT,
    expected_remaining_requests,
    rewrite_pays,
    rewrite_value,
    token_weight,
)


def test_a_cached_token_is_worth_a_tenth_until_the_pool_fills() -> None:
    assert token_weight(0.0) == token_weight(0.5) == CACHED_TOKEN_WEIGHT
    assert token_weight(1.0) == pytest.approx(1.0)
    assert token_weight(0.5) < token_weight(0.75) < token_weight(1.0)
    assert token_weight(-3) == token_weight(0.0) and token_weight(7) == token_weight(1.0)


def test_a_session_is_expected_to_go_on_as_long_as_it_has_run() -> None:
    assert [expected_remaining_requests(n) for n in (0, 1, 40)] == [1, 1, 40]


def test_pressure_and_a_longer_session_make_a_rewrite_pay() -> None:
    # 1,000 tokens removed for 5,000 re-prefilled
    assert rewrite_value(1_000, 10, 0.0) == pytest.approx(1_000)
    assert not rewrite_pays(1_000, 5_000, 10, 0.0)  # idle pool, 10 requests in
    assert rewrite_pays(1_000, 5_000, 60, 0.0)  # a long session: 6,000 > 5,000
    assert rewrite_pays(1_000, 5_000, 10, 1.0)  # a full pool: 10,000 > 5,000
    assert not rewrite_pays(0, 0, 100, 1.0)  # nothing removed: never a rewrite
