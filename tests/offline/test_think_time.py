"""The think-time rule the Locust harness and the simulator share (``offline.think_time``)."""

from __future__ import annotations

import random
import statistics

import pytest

from offline.think_time import ThinkTime


def test_think_time_spec() -> None:
    assert ThinkTime.parse("0").scale_s == 0
    assert ThinkTime.parse("2:0.5") == ThinkTime(2.0, 0.5)
    with pytest.raises(ValueError, match="MEDIAN"):
        ThinkTime.parse("soon")
    with pytest.raises(ValueError, match="cap"):
        ThinkTime.parse("2", cap_s=-1)


def test_think_time_is_the_recorded_gap_capped_else_the_fallback_and_0_saturates() -> None:
    rng = random.Random(0)
    think = ThinkTime.parse("2:0.5", cap_s=30)
    assert think.sample(rng, 4.5) == 4.5
    assert think.sample(rng, 3600.0) == 30  # a person away for an hour: cut to the cap
    drawn = [think.sample(rng, None) for _ in range(200)]
    assert 1.5 < statistics.median(drawn) < 2.5 and len(set(drawn)) == 200
    assert ThinkTime.parse("0").sample(rng, 4.5) == 0.0  # saturation ignores the recording
    ignoring = ThinkTime.parse("2:0.5", recorded=False)
    assert ignoring.sample(random.Random(1), 4.5) == think.sample(random.Random(1), None)


def test_without_sigma_the_draw_is_exponential_with_mean_scale() -> None:
    think = ThinkTime(2.0, None, recorded=False)
    rng = random.Random(0)
    drawn = [think.sample(rng) for _ in range(4000)]
    assert 1.9 < statistics.fmean(drawn) < 2.1
    # exponential: the median is the mean times ln 2 (a lognormal's would be the scale)
    assert 1.3 < statistics.median(drawn) < 1.5
    assert think.sample(random.Random(3)) == random.Random(3).expovariate(1 / 2.0)
