"""Where a cell's prefix went: reusable prefix and losses by cause, from request-log rows."""

from __future__ import annotations

from typing import Any

import pytest

from loadtests.prefix_losses import PrefixLosses, prefix_losses


def request(
    session: str,
    start: float,
    prompt: int,
    cached: int,
    replica: str | None = "r1",
    wait: float | None = 0.0,
    ok: bool = True,
) -> dict[str, Any]:
    return {
        "session": session,
        "start": start,
        "ok": ok,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "replica": replica,
        "admission_wait_s": wait,
    }


def test_each_lost_token_is_put_down_to_one_cause() -> None:
    rows = [
        request("a", 0, 100, 0),
        request("b", 1, 100, 0),
        request("a", 2, 200, 96),  # kept all 3 whole blocks of its previous 100
        request("b", 3, 200, 0, wait=2.5),  # held at admission, then lost 96
        request("a", 4, 300, 0, replica="r2"),  # moved: lost 192
        request("b", 5, 300, 64),  # lost 128 of 192 in a pause: a re-prefill
        request("b", 6, 400, 0, ok=False),  # failed: not counted
    ]
    got = prefix_losses(list(reversed(rows)), block_size=32)  # ordered by start inside
    total = 1200
    assert got == PrefixLosses(
        prefix_reusable=(96 + 96 + 192 + 192) / total,
        prefix_lost_moved=192 / total,
        prefix_lost_after_wait=96 / total,
        prefix_lost_other=128 / total,
        reprefills_per_session=(1 + 2) / 2,  # a: the move; b: the wait and the pause
    )
    # the hit the replies report plus the losses is the reusable share
    hit = (96 + 64) / total
    lost = got.prefix_lost_moved + got.prefix_lost_after_wait + got.prefix_lost_other
    assert hit + lost == pytest.approx(got.prefix_reusable)


def test_a_shorter_prompt_reuses_only_itself_and_an_unnamed_replica_is_no_move() -> None:
    rows = [
        request("a", 0, 320, 0, replica=None, wait=None),
        request("a", 1, 100, 0, replica=None, wait=None),  # rewritten shorter: 96 reusable
        request("a", 2, 200, 96, replica="r2", wait=0.005),  # the first named replica
    ]
    got = prefix_losses(rows, block_size=32)
    assert got.prefix_reusable == (96 + 96) / 620
    assert got.prefix_lost_moved == 0 and got.prefix_lost_after_wait == 0
    assert got.prefix_lost_other == 96 / 620
    assert got.reprefills_per_session == 1


def test_no_requests_and_a_bad_block_size() -> None:
    assert prefix_losses([], 32) == PrefixLosses(0.0, 0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="block size"):
        prefix_losses([], 0)
