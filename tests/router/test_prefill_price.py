"""The prefill price follows the replies: the slope of time to first token against the
tokens their replicas prefilled, the prior until that is measurable."""

from __future__ import annotations

import random

import pytest

from router.prefill_price import MIN_REPLIES, WINDOW, PrefillPrice


def test_the_prior_until_enough_replies_of_different_sizes():
    price = PrefillPrice(2e-5)
    for _ in range(MIN_REPLIES - 1):
        price.observe(1_000, 0.5)
    assert price.per_token_s == 2e-5 and not price.fitted
    price.observe(1_000, 0.5)  # enough replies, but one size: no slope to fit
    assert not price.fitted
    price.observe(3_000, 1.5)
    assert price.fitted


def test_the_slope_of_noisy_replies_is_the_cost_of_one_more_uncached_token():
    rng = random.Random(7)
    price = PrefillPrice(2e-5)
    for _ in range(WINDOW):
        uncached = rng.randrange(100, 8_000)
        queued = rng.uniform(0.0, 0.4)  # the engine's queue, unrelated to the size
        price.observe(uncached, 0.25 + queued + uncached * 5e-4)
    assert price.per_token_s == pytest.approx(5e-4, rel=0.05)


def test_a_load_change_is_followed_within_one_window():
    price = PrefillPrice(2e-5)
    sizes = [500, 1_000, 2_000, 4_000]
    for i in range(WINDOW):
        price.observe(sizes[i % 4], 0.2 + sizes[i % 4] * 5e-4)  # a loaded machine
    for i in range(WINDOW):
        price.observe(sizes[i % 4], 0.2 + sizes[i % 4] * 3e-5)  # the load is gone
    assert price.per_token_s == pytest.approx(3e-5)


def test_replies_that_do_not_rise_with_their_size_keep_the_prior():
    price = PrefillPrice(2e-5)
    for i in range(MIN_REPLIES * 2):
        price.observe(500 + 500 * i, 2.0 - 0.05 * i)  # bigger ones came when queues were short
    assert price.per_token_s == 2e-5 and not price.fitted
    price.observe(-5, 1.0)  # counters that do not add up teach nothing
    assert not price.fitted


def test_a_prior_must_be_a_price():
    with pytest.raises(ValueError):
        PrefillPrice(0.0)
