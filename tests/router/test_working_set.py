"""The working set's pure decisions (router.working_set) and the cost model's price of
bringing an evicted prefix back (recompute against a reload from the offload tier)."""

from __future__ import annotations

import math

import pytest

from router.admission_seam import AdmissionRequest
from router.cost import get_preset
from router.inputs import Candidate
from router.metrics import parse_vllm_metrics
from router.working_set import (
    PAUSE_SLACK,
    Member,
    Room,
    admits,
    expected_pause_s,
    next_release,
    occupied_tokens,
    reservation_s,
    revoked,
)
from router.working_set_admission import WorkingSetAdmission

ROOM = Room(pool_tokens=10_000, used_tokens=0)
NOW = 100.0


def test_a_member_goes_whatever_the_room_and_the_queue():
    members = {"a": Member(9_000, running=0, reserved_until=NOW + 5)}
    assert admits(ROOM, members, "a", 9_000, NOW, fraction=0.9, queued_ahead=3)


def test_a_newcomer_goes_when_it_fits_beside_the_set():
    members = {"a": Member(4_000, running=1), "b": Member(3_000, reserved_until=NOW + 1)}
    assert admits(ROOM, members, "c", 2_000, NOW, fraction=0.9)
    assert not admits(ROOM, members, "c", 2_001, NOW, fraction=0.9)


def test_first_come_first_served_a_newcomer_waits_behind_those_queued():
    assert not admits(ROOM, {}, "c", 10, NOW, fraction=0.9, queued_ahead=1)


def test_an_empty_set_takes_a_session_larger_than_the_pool():
    assert admits(ROOM, {}, "huge", 50_000, NOW, fraction=0.9)
    expired = {"a": Member(9_000, reserved_until=NOW - 1)}  # idle past its reservation
    assert admits(ROOM, expired, "huge", 50_000, NOW, fraction=0.9)


def test_scraped_usage_counts_when_it_exceeds_what_the_gateway_knows_runs():
    members = {"a": Member(1_000, running=1), "b": Member(2_000, reserved_until=NOW + 1)}
    assert occupied_tokens(Room(10_000, used_tokens=500), list(members.values()), NOW) == 3_000
    assert occupied_tokens(Room(10_000, used_tokens=6_000), list(members.values()), NOW) == 8_000
    assert not admits(Room(10_000, 6_000), members, "c", 1_500, NOW, fraction=0.9)


def test_going_without_room_revokes_the_reservations_vllm_evicts_first():
    # vLLM's free queue evicts the blocks freed longest ago first: "b" (ended at 10) goes
    # before "c" (ended at 20); a running member keeps its share; revoking stops once it fits.
    members = {
        "a": Member(3_000, running=1),
        "b": Member(3_000, reserved_until=NOW + 5, ended_at=10.0),
        "c": Member(3_000, reserved_until=NOW + 5, ended_at=20.0),
    }
    assert revoked(ROOM, members, "d", 3_000, NOW, fraction=0.9) == ["b"]
    assert revoked(ROOM, members, "d", 6_000, NOW, fraction=0.9) == ["b", "c"]
    assert revoked(ROOM, members, "d", 50_000, NOW, fraction=0.9) == ["b", "c"]
    assert revoked(ROOM, members, "d", 100, NOW, fraction=1.0) == []  # it fits: none


def test_next_release_is_the_earliest_idle_reservation():
    members = {
        "a": Member(1, running=1, reserved_until=NOW + 1),  # running: not released by time
        "b": Member(1, reserved_until=NOW + 7),
        "c": Member(1, reserved_until=NOW + 3),
    }
    assert next_release(members, NOW) == NOW + 3
    assert next_release({}, NOW) is None


def test_expected_pause_is_the_longest_of_the_sessions_recent_pauses():
    assert expected_pause_s([], prior_s=4.0) == 4.0
    assert expected_pause_s([0.2, 0.1, 5.0, 0.3], prior_s=4.0) == 5.0  # its tool run
    assert expected_pause_s([5.0], prior_s=1.0) == 5.0


def test_a_reservation_covers_the_pause_when_the_re_prefill_costs_more_than_a_step():
    cost = get_preset("h200-qwen3.6-27b")
    assert reservation_s(10.0, 30_000, cost, max_s=120.0) == PAUSE_SLACK * 10.0
    assert reservation_s(1_000.0, 30_000, cost, max_s=120.0) == 120.0
    # 16 tokens re-prefill in less than one engine step: not worth holding the pool for.
    assert reservation_s(10.0, 16, cost, max_s=120.0) == 0.0


def test_an_offload_tier_prices_a_reload_against_a_recompute():
    cost = get_preset("h200-qwen3.6-27b")
    assert cost.reload_s(32_768) == math.inf  # no tier
    tiered = cost.with_offload(100 * 2**30)
    assert tiered.offload_tokens == 100 * 2**30 // cost.kv_bytes_per_token
    # 32k tokens: 2 GiB over ~50 GB/s (~43 ms) against ~3.6 s of prefill.
    assert tiered.restore_s(32_768) == pytest.approx(32_768 * 65_536 / 50e9)
    assert tiered.restore_s(32_768) < cost.prefill_s(32_768) / 50
    # What the tier cannot hold is recomputed.
    small = cost.with_offload(16_384 * cost.kv_bytes_per_token)
    assert small.restore_s(32_768) == pytest.approx(small.reload_s(16_384) + cost.prefill_s(16_384))
    # Cheap to bring back: a paused session's footprint is not reserved.
    assert reservation_s(10.0, 2_000, tiered, max_s=120.0) == 0.0


def test_the_pool_size_comes_from_vllms_cache_config_info():
    page = (
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="640"} 1.0\n'
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    )
    assert parse_vllm_metrics(page).kv_pool_tokens == 640 * 32
    bare = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    assert parse_vllm_metrics(bare).kv_pool_tokens is None


# -- the state at the routing seam (router.working_set_admission), as the gateway and the
# simulator drive it: decide, started, ended, with the caller's clock.

POOL = 10_000


def seam(reserve: bool = True, max_wait_s: float = 5.0) -> WorkingSetAdmission:
    return WorkingSetAdmission(
        get_preset("cpu-tiny"),
        fraction=0.9,
        max_wait_s=max_wait_s,
        reserve=reserve,
        reservation_max_s=30.0,
        pool_tokens=POOL,
    )


def ask(session: str, now: float, tokens: int = 4_000, waited_s: float = 0.0, url: str = "r1"):
    return AdmissionRequest("t", session, url, tokens, None, (), now, waited_s)


def go(admission: WorkingSetAdmission, session: str, now: float, tokens: int = 4_000) -> None:
    request = ask(session, now, tokens)
    assert admission.decide(request).admit
    admission.started(request)


def test_the_seam_admits_while_it_fits_then_queues_first_come_first_served():
    admission = seam()
    go(admission, "a", 0.0)
    go(admission, "b", 0.1)  # 8,000 of 9,000
    refused = admission.decide(ask("c", 0.2))
    assert not refused.admit and refused.reason == "waiting"
    assert refused.retry_at == pytest.approx(0.2 + 5.0)  # its deadline: nothing is reserved
    assert not admission.decide(ask("d", 0.3, tokens=100)).admit  # small, but behind c
    admission.ended("t", "a", "r1", 1.0, served=False)  # a failed: no reservation
    # d asks first, yet c came first: d still waits, c goes.
    assert not admission.decide(ask("d", 1.1, tokens=100, waited_s=0.8)).admit
    verdict = admission.decide(ask("c", 1.2, waited_s=1.0))
    assert verdict.admit and verdict.reason == "waited"


def test_a_served_session_keeps_its_share_through_its_pause_and_releases_it_after():
    admission = seam(max_wait_s=20.0)
    go(admission, "a", 0.0, tokens=8_000)
    admission.ended("t", "a", "r1", 1.0)  # no pause seen yet: the prior, 5 s x 1.5
    assert admission.holds("t", "a", "r1", 8.0)
    refused = admission.decide(ask("b", 2.0))
    assert not refused.admit and refused.retry_at == pytest.approx(1.0 + PAUSE_SLACK * 5.0)
    go(admission, "a", 3.0, tokens=8_000)  # back within its reservation: straight in
    admission.ended("t", "a", "r1", 4.0)  # its own pause (2 s) now sizes the next: 3 s
    assert admission.holds("t", "a", "r1", 6.9) and not admission.holds("t", "a", "r1", 7.1)
    verdict = admission.decide(ask("b", 7.1, waited_s=5.1))
    assert verdict.admit and verdict.reason == "waited"  # released, not timed out


def test_nobody_waits_past_the_bound():
    admission = seam(max_wait_s=2.0)
    go(admission, "a", 0.0, tokens=9_000)
    assert not admission.decide(ask("b", 0.5)).admit
    verdict = admission.decide(ask("b", 2.5, waited_s=2.0))
    assert verdict.admit and verdict.reason == "timed_out"


def test_a_request_past_the_bound_takes_the_room_of_the_oldest_paused_session():
    admission = seam(max_wait_s=2.0)
    go(admission, "a", 0.0)
    go(admission, "b", 0.1)
    admission.ended("t", "a", "r1", 1.0)  # paused first: vLLM evicts its blocks first
    admission.ended("t", "b", "r1", 1.5)
    assert not admission.decide(ask("c", 1.6)).admit
    verdict = admission.decide(ask("c", 3.6, waited_s=2.0))
    assert verdict.admit and verdict.reason == "timed_out"
    admission.started(ask("c", 3.6))
    # "a" lost its reservation (it queues when it is back); "b" keeps its own.
    assert not admission.holds("t", "a", "r1", 3.7)
    assert admission.holds("t", "b", "r1", 3.7)
    assert not admission.decide(ask("a", 3.8)).admit


def test_a_member_whose_prefix_grew_past_the_room_takes_the_oldest_paused_ones():
    admission = seam(max_wait_s=2.0)
    go(admission, "a", 0.0, tokens=3_000)
    go(admission, "b", 0.1, tokens=3_000)
    go(admission, "c", 0.2, tokens=2_000)
    admission.ended("t", "a", "r1", 1.0)
    admission.ended("t", "b", "r1", 1.5)
    admission.ended("t", "c", "r1", 2.0)
    go(admission, "c", 2.1, tokens=5_000)  # 3,000 + 3,000 + 5,000 > 9,000: "a" goes
    assert not admission.holds("t", "a", "r1", 2.2)
    assert admission.holds("t", "b", "r1", 2.2)
    assert not admission.decide(ask("a", 2.3)).admit  # back: it waits for room


def test_without_reservations_a_paused_session_leaves_the_set():
    admission = seam(reserve=False)
    go(admission, "a", 0.0, tokens=9_000)
    admission.ended("t", "a", "r1", 1.0)
    assert not admission.holds("t", "a", "r1", 1.0)
    assert admission.decide(ask("b", 1.0)).admit


def test_the_seams_pool_comes_from_the_candidates_scrape_then_the_cost_model():
    admission = WorkingSetAdmission(get_preset("cpu-tiny"))
    scraped = Candidate("r1", 0, 0, 0, 0.5, 0, kv_pool_tokens=2_000)
    assert admission.room(scraped) == Room(2_000, 1_000)
    assert admission.room(None) == Room(get_preset("cpu-tiny").kv_pool_tokens, 0)
