"""The working set's pure decisions (router.working_set), its priced early admission, and
the cost model's price of bringing an evicted prefix back (recompute against a reload from
the offload tier)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router.admission_seam import AdmissionRequest
from router.cost import CostModel, get_preset
from router.inputs import Candidate
from router.metrics import parse_vllm_metrics
from router.working_set import (
    PAUSE_JITTER_S,
    PAUSE_SLACK,
    Headroom,
    Member,
    Room,
    admits,
    early_at,
    eviction_s,
    expected_pause_s,
    next_release,
    occupied_tokens,
    reservation_s,
    revoked,
    room_at,
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


def test_with_headroom_a_newcomer_leaves_room_for_the_sets_next_steps():
    members = {
        "a": Member(4_000, running=1, growth=300),
        "b": Member(3_000, reserved_until=NOW + 1, growth=200),
        "gone": Member(1_000, reserved_until=NOW - 1, growth=5_000),  # out of the set
    }
    # one step: 300 + 200 of the members', 100 of its own
    assert admits(ROOM, members, "c", 1_400, NOW, fraction=0.9, headroom=Headroom(1, 100))
    assert not admits(ROOM, members, "c", 1_401, NOW, fraction=0.9, headroom=Headroom(1, 100))
    assert not admits(ROOM, members, "c", 1_000, NOW, fraction=0.9, headroom=Headroom(2, 100))
    assert admits(ROOM, members, "c", 1_000, NOW, fraction=0.9, headroom=Headroom(0, 100))
    # a member goes whatever the headroom; an empty set still takes anyone
    assert admits(ROOM, members, "a", 9_000, NOW, fraction=0.9, headroom=Headroom(9, 9))
    assert admits(ROOM, {}, "c", 50_000, NOW, fraction=0.9, headroom=Headroom(9, 9))
    # room comes as admits counts it: once b's reservation has ended, with b's growth gone
    at = room_at(ROOM, members, "c", 1_800, NOW, fraction=0.9, headroom=Headroom(1, 100))
    assert at == NOW + 1
    assert room_at(ROOM, members, "c", 1_800, NOW, fraction=0.9) == NOW


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


def test_a_quick_pause_is_held_a_moment_past_its_jitter():
    # 0.1 s pauses: 1.5x would end the reservation 50 ms after the pause, within the
    # gateway's own measuring jitter; it lasts the pause and PAUSE_JITTER_S.
    cost = get_preset("h200-qwen3.6-27b")
    assert reservation_s(0.1, 30_000, cost, max_s=120.0) == pytest.approx(0.1 + PAUSE_JITTER_S)
    assert reservation_s(0.1, 30_000, cost, max_s=0.5) == 0.5


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


def seam(
    reserve: bool = True,
    max_wait_s: float = 5.0,
    work_conserving: bool = False,
    cost: CostModel | None = None,
    price_fit: bool = False,
) -> WorkingSetAdmission:
    # The waiting itself (work_conserving off); the priced early admission's own tests pass
    # it on, with a cost model whose restores cost what they are meant to.
    return WorkingSetAdmission(
        cost or get_preset("cpu-tiny"),
        fraction=0.9,
        max_wait_s=max_wait_s,
        reserve=reserve,
        reservation_max_s=30.0,
        pool_tokens=POOL,
        work_conserving=work_conserving,
        price_fit=price_fit,
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


def test_a_reply_that_ended_the_agents_turn_reserves_nothing_and_sizes_no_pause():
    admission = seam(max_wait_s=20.0)
    go(admission, "a", 0.0, tokens=8_000)
    admission.ended("t", "a", "r1", 1.0)
    go(admission, "a", 3.0, tokens=8_000)  # a 2-s tool pause
    admission.ended("t", "a", "r1", 4.0, pausing=False)  # no tool called: the turn ended
    assert not admission.holds("t", "a", "r1", 4.0)
    assert admission.decide(ask("b", 4.1)).admit  # its room is free at once
    admission.withdrawn("t", "b")
    go(admission, "a", 604.0, tokens=8_000)  # its person answered ten minutes later
    admission.ended("t", "a", "r1", 605.0)
    # The reservation is sized by the tool pause (2 s x 1.5), not by the person's 600 s.
    assert admission.holds("t", "a", "r1", 607.9) and not admission.holds("t", "a", "r1", 608.1)


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


def test_with_growth_steps_the_seam_keeps_room_for_its_members_growth():
    def filled(growth_steps: int) -> WorkingSetAdmission:
        admission = WorkingSetAdmission(
            get_preset("cpu-tiny"), fraction=0.9, max_wait_s=5.0, pool_tokens=POOL,
            work_conserving=False, growth_steps=growth_steps,
        )  # fmt: skip
        go(admission, "a", 0.0, tokens=2_000)
        admission.ended("t", "a", "r1", 1.0)
        go(admission, "a", 2.0, tokens=3_000)  # grew by 1,000 at this step
        return admission

    # 3,000 + 5,500 fit in 9,000 today, not with a's next 1,000 and b's first step (none)
    assert filled(0).decide(ask("b", 2.1, tokens=5_500)).admit
    assert not filled(1).decide(ask("b", 2.1, tokens=5_500)).admit
    assert filled(1).decide(ask("b", 2.1, tokens=5_000)).admit
    # an entrant's own growth counts: b was here before at 1,000 and is back at 4,000
    admission = filled(1)
    go(admission, "b", 2.1, tokens=1_000)
    admission.ended("t", "b", "r1", 2.2, served=False)  # out of the set, its size kept
    refused = admission.decide(ask("b", 2.3, tokens=4_000))  # 3,000 + 4,000 + 1,000 + 3,000
    assert not refused.admit
    assert filled(0).decide(ask("b", 2.3, tokens=4_000)).admit
    with pytest.raises(ValueError, match="admission_growth_steps"):
        WorkingSetAdmission(get_preset("cpu-tiny"), growth_steps=-1)


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


# -- priced early admission (router.working_set.early_at): a waiter goes before room
# comes when its wait costs more than the restores going forces and the slowdown of what
# runs. cpu-tiny restores 3,000 tokens in ~0.1 s; SLOW (the loaded 2-core machine's ~1 ms
# per prefill token) in ~3 s.

TINY = get_preset("cpu-tiny")
SLOW = replace(TINY, per_prefill_token_s=1e-3)


def paused(until_b: float = NOW + 6) -> dict[str, Member]:
    # "a" paused first (vLLM evicts it first); "b"'s reservation ends first.
    return {
        "a": Member(4_000, reserved_until=NOW + 10, ended_at=NOW - 2),
        "b": Member(4_000, reserved_until=until_b, ended_at=NOW - 1),
    }


def early(members, tokens=4_000, cost=TINY, running=0, deadline=NOW + 30, waited_s=0.0) -> bool:
    at = early_at(
        ROOM, members, "c", tokens, NOW, fraction=0.9, cost=cost, running=running,
        deadline=deadline, waited_s=waited_s,
    )  # fmt: skip
    return at is not None and at <= NOW


def test_room_comes_when_enough_reservations_end_and_never_past_the_running_ones():
    assert room_at(ROOM, paused(), "c", 4_000, NOW, fraction=0.9) == NOW + 6  # "b" ends
    assert room_at(ROOM, paused(), "c", 8_000, NOW, fraction=0.9) == NOW + 10  # both
    assert room_at(ROOM, paused(), "c", 1_000, NOW, fraction=0.9) == NOW  # it fits
    running = {"a": Member(6_000, running=1), "b": Member(3_000, reserved_until=NOW + 5)}
    assert room_at(ROOM, running, "c", 4_000, NOW, fraction=0.9) is None


def test_going_costs_the_restore_of_the_evicted_tails_only():
    # 4,000 + 4,000 + 4,000 is 3,000 past the 9,000 share: "a" (freed first) loses that
    # much of its tail; its head still hits.
    assert eviction_s(ROOM, paused(), "c", 4_000, NOW, fraction=0.9, cost=SLOW) == (
        pytest.approx(SLOW.restore_s(3_000))
    )
    both = SLOW.restore_s(4_000) + SLOW.restore_s(3_000)
    assert eviction_s(ROOM, paused(), "c", 8_000, NOW, fraction=0.9, cost=SLOW) == (
        pytest.approx(both)
    )
    assert eviction_s(ROOM, paused(), "c", 1_000, NOW, fraction=0.9, cost=SLOW) == 0.0


def test_an_idle_replica_takes_a_waiter_whose_evictions_restore_in_less_than_its_wait():
    assert early(paused(), cost=TINY)  # ~0.1 s of restore against 6 s of waiting
    assert early(paused(), cost=SLOW)  # ~3 s against 6 s


def test_a_waiter_waits_when_the_restore_costs_more_than_the_wait():
    assert not early(paused(until_b=NOW + 2), cost=SLOW)  # ~3 s of restore against 2 s
    assert early(paused(until_b=NOW + 2), cost=TINY)  # the same wait, a cheap restore


def test_a_busy_replica_prices_the_waiters_prefill_into_what_runs_there():
    # ~3 s of restore plus ~4 s of prefill stretching one running request: past 6 s.
    assert early(paused(), cost=SLOW, running=0)
    assert not early(paused(), cost=SLOW, running=1)


def test_a_waiter_goes_once_it_has_waited_as_long_as_going_costs():
    # ~3 s of restore against 2 s to the room: it waits, until it has waited ~3 s in all.
    going = eviction_s(ROOM, paused(NOW + 2), "c", 4_000, NOW, fraction=0.9, cost=SLOW)
    at = early_at(
        ROOM, paused(NOW + 2), "c", 4_000, NOW, fraction=0.9, cost=SLOW, running=0,
        deadline=NOW + 30, waited_s=1.0,
    )  # fmt: skip
    assert at == pytest.approx(NOW + going - 1.0)
    assert not early(paused(until_b=NOW + 2), cost=SLOW, waited_s=going - 0.1)
    assert early(paused(until_b=NOW + 2), cost=SLOW, waited_s=going)


def test_a_returning_waiter_goes_where_it_would_lose_more_of_its_own_prefix_than_it_evicts():
    # ~3 s of the members' restores against 2 s to the room: a newcomer waits; one whose
    # last 4,000 tokens are still on the replica would lose them waiting (~4 s): it goes.
    def goes(own_tokens: int) -> bool:
        at = early_at(
            ROOM, paused(NOW + 2), "c", 4_000, NOW, fraction=0.9, cost=SLOW, running=0,
            deadline=NOW + 30, own_tokens=own_tokens,
        )  # fmt: skip
        return at is not None and at <= NOW

    assert not goes(0)
    assert goes(4_000)
    assert not goes(500)  # ~0.5 s of its own against ~3 s of theirs, 2 s to wait


def test_room_only_past_the_deadline_goes_now():
    # The wait would end in the timeout revoking the same paused sessions: go now.
    assert early(paused(until_b=NOW + 2), cost=SLOW, deadline=NOW + 1)
    assert not early(paused(until_b=NOW + 2), cost=SLOW, deadline=NOW + 30)


def test_where_running_members_alone_hold_the_room_it_goes_to_vllms_queue_at_once():
    # No reservation's end makes room: vLLM queues it and admits it when "a" frees its
    # blocks, which the gateway would learn only at a's reply's end. Going evicts only the
    # paused ("b"): vLLM never preempts a running request for a waiting one.
    running = {"a": Member(6_000, running=1), "b": Member(3_000, reserved_until=NOW + 5)}
    assert early(running, cost=SLOW, running=1)
    assert revoked(ROOM, running, "c", 4_000, NOW, fraction=0.9) == ["b"]


def two_paused(admission: WorkingSetAdmission) -> None:
    """ "a" and "b" (4,000 each) served and paused at 1.0 and 1.5: reserved for the prior
    pause x 1.5, until 8.5 and 9.0."""
    go(admission, "a", 0.0)
    go(admission, "b", 0.1)
    admission.ended("t", "a", "r1", 1.0)
    admission.ended("t", "b", "r1", 1.5)


def test_the_seam_admits_a_waiter_priced_and_revokes_what_vllm_evicts_for_it():
    admission = seam(work_conserving=True, max_wait_s=20.0)
    two_paused(admission)
    verdict = admission.decide(ask("c", 2.0))  # room at 8.5; ~0.1 s of restore
    assert verdict.admit and verdict.reason == "priced"
    admission.started(ask("c", 2.0))
    assert not admission.holds("t", "a", "r1", 2.1)  # paused first: its blocks go
    assert admission.holds("t", "b", "r1", 2.1)
    assert admission.holds("t", "c", "r1", 2.1)


def test_switched_off_the_same_waiter_waits_for_room_as_before():
    admission = seam(work_conserving=False, max_wait_s=20.0)
    two_paused(admission)
    verdict = admission.decide(ask("c", 2.0))
    assert not verdict.admit and verdict.reason == "waiting"
    assert verdict.retry_at == pytest.approx(1.0 + PAUSE_SLACK * 5.0)  # "a"'s release
    assert admission.holds("t", "a", "r1", 2.1)


def test_members_that_keep_coming_back_hold_a_waiter_no_longer_than_going_costs():
    # "a" and "b" pause 0.2 s and come back within their reservations, again and again:
    # the room is always a moment away and never comes. "c" goes, priced, once it has
    # waited what evicting "a"'s tail costs, and is asked again at that moment.
    admission = seam(work_conserving=True, max_wait_s=30.0, cost=SLOW)
    for session, start in (("a", 0.0), ("b", 0.1), ("a", 0.7), ("b", 0.8)):
        go(admission, session, start)
        admission.ended("t", session, "r1", start + 0.2)
    going = SLOW.restore_s(3_000)
    first = admission.decide(ask("c", 1.05))
    assert not first.admit and first.retry_at < 1.05 + going
    t, turn, verdicts = 1.1, 0, []
    while t < 1.05 + going + 0.5:
        session = "ab"[turn % 2]
        go(admission, session, t)
        admission.ended("t", session, "r1", t + 0.05)
        verdict = admission.decide(ask("c", t + 0.06, waited_s=t + 0.06 - 1.05))
        verdicts.append((t + 0.06 - 1.05, verdict))
        if verdict.admit:
            break
        t, turn = t + 0.1, turn + 1
    waited, last = verdicts[-1]
    assert last.admit and last.reason == "priced"
    assert going <= waited < going + 0.1
    assert all(v.reason == "waiting" for _, v in verdicts[:-1])


def test_the_seam_counts_what_a_returning_session_left_on_its_replica():
    admission = seam(work_conserving=True, max_wait_s=20.0, cost=SLOW)
    go(admission, "c", 0.0, tokens=3_000)  # "c" ran on r1 and left 3,000 there ...
    admission.ended("t", "c", "r1", 0.2, served=False)  # ... and holds no share now
    two_paused(admission)
    # Both evicted for 8,000 (~7.1 s) against 6 s to the room at 9.0: a newcomer "d"
    # waits; "c", whose 3,000 waiting would cost it ~3 s more, goes.
    assert not admission.decide(ask("d", 3.0, tokens=8_000)).admit
    admission.withdrawn("t", "d")
    verdict = admission.decide(ask("c", 3.0, tokens=8_000))
    assert verdict.admit and verdict.reason == "priced"


def test_a_priced_admission_keeps_first_come_first_served():
    admission = seam(work_conserving=True, max_wait_s=20.0, cost=SLOW)
    two_paused(admission)
    # "c" needs both evicted (~7.1 s of restores) and room comes at 9.0 (6 s): it waits.
    assert not admission.decide(ask("c", 3.0, tokens=8_000)).admit
    # "d" alone would go (~1 s of restore against 5.5 s) but "c" came first.
    assert not admission.decide(ask("d", 3.1, tokens=2_000)).admit
    admission.withdrawn("t", "c")  # once "c" is gone, "d" is first: it goes, priced
    verdict = admission.decide(ask("d", 3.2, tokens=2_000, waited_s=0.1))
    assert verdict.admit and verdict.reason == "priced"


def test_with_priced_admission_a_waiter_behind_running_requests_alone_goes_at_once():
    # Switched off, "b" waits for "a"'s reply (``test_nobody_waits_past_the_bound``);
    # priced, it goes to vLLM's queue, which admits it the moment "a" frees its blocks.
    admission = seam(work_conserving=True, max_wait_s=2.0)
    go(admission, "a", 0.0, tokens=6_000)  # running: its room is not evicted
    verdict = admission.decide(ask("b", 0.5))
    assert verdict.admit and verdict.reason == "priced"
    admission.started(ask("b", 0.5))
    assert admission.holds("t", "a", "r1", 0.6)


def test_with_price_fit_the_seam_prices_restores_at_what_the_replies_say():
    """Priced at SLOW, "c" waits (~7.1 s of restores against 6 s); replies whose first
    tokens say an uncached token costs TINY's figure make the same restores cheap: it goes."""
    admission = seam(work_conserving=True, max_wait_s=20.0, cost=SLOW, price_fit=True)
    two_paused(admission)
    assert not admission.decide(ask("c", 3.0, tokens=8_000)).admit
    admission.withdrawn("t", "c")
    for i, uncached in enumerate((500, 1_000, 2_000, 4_000) * 2):
        first_token_s = 0.2 + uncached * TINY.per_prefill_token_s
        admission.ended("t", f"other{i}", "r2", 2.0, first_token=(uncached, first_token_s))
    assert admission.cost.per_prefill_token_s == pytest.approx(TINY.per_prefill_token_s)
    verdict = admission.decide(ask("c", 3.0, tokens=8_000))
    assert verdict.admit and verdict.reason == "priced"


def test_without_price_fit_the_replies_leave_the_price_alone():
    admission = seam(work_conserving=True, cost=SLOW)
    for uncached in (500, 1_000, 2_000, 4_000) * 2:
        admission.ended("t", "x", "r1", 1.0, first_token=(uncached, 0.2 + uncached * 1e-6))
    assert admission.cost == SLOW
