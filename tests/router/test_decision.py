"""A routing decision as a pure function of its inputs, and the state kept around it."""

from __future__ import annotations

import copy

from gateway.config import GatewayConfig
from router import ASSIGNMENT_TTL_S, REHOME_MARGIN, get_preset, make_policy
from router.decision import Choice, Decider
from router.inputs import Candidate, RouteHints, RouteInput
from router.placements import Placements
from tests.router.support import NoStore

URLS = ("http://a:1", "http://b:1", "http://c:1")


def view(url: str, load: float = 0, bound: int = 0) -> Candidate:
    return Candidate(url, running=load, waiting=0, in_flight=0, kv_usage=0.1, bound_sessions=bound)


def sticky() -> Decider:
    return make_policy("sticky", assignments=NoStore(), rehome_margin=2).decider


def inp(*candidates: Candidate, **fields: object) -> RouteInput:
    return RouteInput("t", "s", RouteHints(), candidates, frozenset(URLS), **fields)  # type: ignore[arg-type]


def test_the_same_input_gives_the_same_choice_and_is_not_changed() -> None:
    for name in ("round_robin", "least_loaded", "sticky", "sticky_cost"):
        decider = make_policy(name, assignments=NoStore(), cost=get_preset("cpu-tiny")).decider
        given = inp(view(URLS[0]), view(URLS[1]), assignment=URLS[1], turns={"new": 3})
        before = copy.deepcopy(given)
        choices = {decider.decide(given) for _ in range(5)}
        assert len(choices) == 1, name
        assert given == before


def test_the_rotation_is_an_input_and_the_choice_says_it_took_a_turn() -> None:
    decider = make_policy("round_robin").decider
    views = (view(URLS[0]), view(URLS[1]), view(URLS[2]))
    picked = [decider.decide(inp(*views, turns={"new": t})) for t in range(4)]
    assert [c.url for c in picked] == [URLS[0], URLS[1], URLS[2], URLS[0]]
    assert {c.turned for c in picked} == {"new"}
    assert {c.reason for c in picked} == {"round_robin"}


def test_a_bound_session_stays_within_the_margin_and_moves_past_it() -> None:
    a, b, _ = URLS
    decider = sticky()
    assert decider.decide(inp(view(a, 2), view(b, 0), assignment=a)) == Choice(a, "sticky")
    moved = decider.decide(inp(view(a, 3), view(b, 0), assignment=a))
    assert (moved.url, moved.reason, moved.moved_from) == (b, "overloaded", a)
    new = decider.decide(inp(view(a, 3), view(b, 0)))
    assert (new.url, new.reason, new.moved_from) == (b, "new", None)


def test_the_replica_admission_let_the_request_into_is_taken_while_it_is_a_candidate() -> None:
    a, b, _ = URLS
    decider = sticky()
    busy_a = (view(a, 9), view(b, 0))  # on load alone the session would move to b
    held = RouteHints(admitted=a)
    assert decider.decide(RouteInput("t", "s", held, busy_a, frozenset(URLS), assignment=a)) == (
        Choice(a, "sticky")
    )
    new = decider.decide(RouteInput("t", "s", held, busy_a, frozenset(URLS)))
    assert (new.url, new.reason) == (a, "new")
    # Admitted elsewhere than its assignment: it moves there, and says why.
    moved = decider.decide(RouteInput("t", "s", RouteHints(admitted=b), (view(a), view(b, 5)),
                                      frozenset(URLS), assignment=a))  # fmt: skip
    assert (moved.url, moved.reason, moved.moved_from) == (b, "admitted", a)
    # Not a candidate (failover excluded it, or it is unhealthy): the policy decides.
    gone = decider.decide(RouteInput("t", "s", held, (view(b),), frozenset(URLS), exclude={a}))
    assert gone.url == b


def test_why_an_assigned_replica_cannot_keep_its_session() -> None:
    a, b, _ = URLS
    decider = sticky()
    gone = decider.decide(inp(view(a), assignment="http://elsewhere:1"))
    assert (gone.url, gone.reason, gone.moved_from) == (a, "gone", "http://elsewhere:1")
    excluded = decider.decide(inp(view(a), assignment=b, exclude=frozenset({b})))
    assert (excluded.reason, excluded.moved_from) == ("excluded", b)
    unhealthy = decider.decide(inp(view(a), assignment=b))
    assert (unhealthy.reason, unhealthy.moved_from) == ("unhealthy", b)


def test_placements_count_each_replicas_keys_and_drop_the_oldest() -> None:
    placed = Placements(limit=2)
    placed.place(("t", "s1"), "a")
    placed.place(("t", "s2"), "a")
    placed.place(("t", "s1"), "b")  # moved: counted once, now the most recent
    assert (placed.count("a"), placed.count("b")) == (1, 1)
    placed.place(("t", "s3"), "b")  # over the limit: s2, the least recently placed, goes
    assert placed.home(("t", "s2")) is None
    assert (placed.count("a"), placed.count("b")) == (0, 2)
    placed.forget(("t", "s1"))
    placed.forget(("t", "nobody"))
    assert placed.count("b") == 1


def test_each_knob_has_one_default() -> None:
    """The gateway's config, make_policy and the simulator (which builds its policies with
    make_policy) start from the same constants."""
    policy = make_policy("sticky", assignments=NoStore())
    assert policy.knobs.rehome_margin == GatewayConfig.rehome_margin == REHOME_MARGIN == 8.0
    assert policy.ttl_s == GatewayConfig.assignment_ttl_s == ASSIGNMENT_TTL_S
