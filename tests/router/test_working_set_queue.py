"""Working-set admission's waiting queues: asking again only the waiters ``wake`` names
(the first of each replica's queue, those whose replica is chosen by room) admits the same
requests, for the same replicas, in the same order as asking every waiter again in
arrival order; and many waiters cost a few asks per change, not one each."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from gateway.steps.working_set import WorkingSetGate
from router import ReplicaMetrics, ReplicaPool
from router.admission_seam import AdmissionRequest, admission_request
from router.cost import get_preset
from router.inputs import Candidate
from router.working_set_admission import WorkingSetAdmission

POOL_TOKENS = 10_000
URLS = tuple(f"http://replica-{i}:8000" for i in range(3))

Admitted = tuple[int, str, str, str]  # step, session, replica, outcome


def seam() -> WorkingSetAdmission:
    # No reservations, no deadline within a script: the state changes only by the
    # script's events, so the two ways of asking again must agree exactly. Waiting for
    # room (work_conserving off): with no paused members, a priced waiter would go at once.
    return WorkingSetAdmission(
        get_preset("cpu-tiny"), max_wait_s=1e9, reserve=False, pool_tokens=POOL_TOKENS,
        work_conserving=False,
    )  # fmt: skip


def candidates(usage: dict[str, float]) -> tuple[Candidate, ...]:
    return tuple(Candidate(u, 0.0, 0.0, 0, usage[u], 0, POOL_TOKENS) for u in URLS)


def run(seed: int, *, ask_all: bool) -> list[Admitted]:
    """A random script: sessions send (to the replica they last ran on, or, new or sent
    elsewhere, to whichever has most room), replies end, scrapes change the replicas'
    usage; after each reply end the held requests are asked again."""
    rng = random.Random(seed)
    admission = seam()
    usage = dict.fromkeys(URLS, 0.0)
    home: dict[str, str | None] = {}
    held: dict[tuple[str, str], tuple[int, str, int]] = {}  # -> (since, session, tokens)
    running: dict[str, str] = {}
    admitted: list[Admitted] = []

    def request(session: str, tokens: int, since: int, now: int) -> AdmissionRequest:
        made = admission_request(
            "t", session, home.get(session), tokens, candidates(usage), now=float(now),
            since=float(since), free=lambda c: admission.free_tokens(c, float(now)),
        )  # fmt: skip
        assert made is not None
        return made

    def ask(key: tuple[str, str], now: int) -> None:
        since, session, tokens = held[key]
        req = request(session, tokens, since, now)
        verdict = admission.decide(req)
        if verdict.admit:
            del held[key]
            admission.started(req)
            running[session] = req.replica
            home[session] = req.replica
            admitted.append((now, session, req.replica, verdict.reason))

    for now in range(400):
        roll = rng.random()
        session = f"s{rng.randrange(24)}"
        if roll < 0.55:
            if session in running or ("t", session) in held:
                continue
            if rng.random() < 0.1:
                home[session] = None  # its assignment expired
            tokens = rng.randrange(500, 4_000)
            req = request(session, tokens, now, now)
            verdict = admission.decide(req)
            if verdict.admit:
                admission.started(req)
                running[session] = req.replica
                home[session] = req.replica
                admitted.append((now, session, req.replica, verdict.reason))
            else:
                held[("t", session)] = (now, session, tokens)
        elif roll < 0.9:
            if not running:
                continue
            session = rng.choice(sorted(running))
            admission.ended("t", session, running.pop(session), float(now))
            if ask_all:
                for key in list(held):
                    if key in held:
                        ask(key, now)
            else:
                admission.wake(lambda key, now=now: ask(key, now))
        else:  # a scrape: what the replicas' running requests use, as they report it
            usage[rng.choice(URLS)] = rng.choice([0.0, 0.2, 0.5, 0.8])
    return admitted


@pytest.mark.parametrize("seed", range(40))
def test_asking_the_named_waiters_admits_as_asking_every_waiter(seed: int) -> None:
    named = run(seed, ask_all=False)
    assert named == run(seed, ask_all=True)
    assert any(outcome == "waited" for *_, outcome in named), "the script should make some wait"


def ask_for(admission: WorkingSetAdmission, session: str, url: str | None, now: float):
    made = admission_request(
        "t", session, url, 3_000, candidates(dict.fromkeys(URLS, 0.0)), now=now, since=now,
        free=lambda c: admission.free_tokens(c, now),
    )  # fmt: skip
    assert made is not None
    return made


def test_a_reply_end_asks_a_few_of_many_waiters_not_each() -> None:
    admission = seam()
    for i, url in enumerate(URLS):  # three members fill each pool (9,000 of 9,000)
        for j in range(3):
            req = ask_for(admission, f"m{i}{j}", url, 0.0)
            assert admission.decide(req).admit
            admission.started(req)
    waiters = 300
    for w in range(waiters):
        assert not admission.decide(ask_for(admission, f"w{w}", URLS[w % 3], 1.0 + w)).admit
    asked: list[tuple[str, str]] = []

    def ask(key: tuple[str, str]) -> None:
        asked.append(key)
        w = int(key[1][1:])
        req = replace_now(ask_for(admission, key[1], URLS[w % 3], 1.0 + w), 500.0)
        if admission.decide(req).admit:
            admission.started(req)

    admission.ended("t", "m00", URLS[0], 400.0)  # one reply ends: room for one on it
    admission.wake(ask)
    # The first waiter of each replica, and r0's next once its first went: 4 asks of 300.
    assert asked == [("t", "w0"), ("t", "w1"), ("t", "w2"), ("t", "w3")]
    assert "w0" not in {k[1] for k in admission.waiting}
    assert len(admission.waiting) == waiters - 1


def replace_now(request: AdmissionRequest, now: float) -> AdmissionRequest:
    return replace(request, now=now, waited_s=now - request.now)


class CountingAdmission(WorkingSetAdmission):
    def __init__(self) -> None:
        super().__init__(
            get_preset("cpu-tiny"), max_wait_s=1e9, reserve=False, pool_tokens=POOL_TOKENS,
            work_conserving=False,
        )  # fmt: skip
        self.decisions = 0

    def decide(self, request: AdmissionRequest):
        self.decisions += 1
        return super().decide(request)


async def test_the_gateways_waiters_cost_a_few_asks_per_reply_end_not_one_each() -> None:
    pool = ReplicaPool(list(URLS[:1]))
    for r in pool.replicas:
        r.healthy = True
        r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
    admission = CountingAdmission()
    clock = [0.0]
    gate = WorkingSetGate(admission, pool, clock=lambda: clock[0])
    tickets = [await gate.admit("t", f"m{i}", URLS[0], 3_000) for i in range(3)]  # the pool full
    waiters = 200
    tasks = []
    for w in range(waiters):  # one after another
        clock[0] += 1.0
        tasks.append(asyncio.create_task(gate.admit("t", f"w{w}", URLS[0], 3_000)))
        while len(admission.waiting) <= w:  # it has asked once
            await asyncio.sleep(0)
    before = admission.decisions
    gate.finish(tickets[0], served=False)  # room for one
    first = await tasks[0]
    assert first.outcome == "waited" and first.request is not None
    # The first waiter went; the next was asked and waits: 2 asks, not 200.
    assert admission.decisions - before == 2
    assert not any(t.done() for t in tasks[1:])
    before = admission.decisions
    for t in tasks[1:]:
        t.cancel()
    await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert not admission.waiting  # the cancelled ones withdrew
    # Each one that went asked again for the next of the queue (the last none): linear.
    assert admission.decisions - before == waiters - 2


async def test_a_timer_due_as_a_wake_lets_the_waiter_go_starts_one_share(monkeypatch) -> None:
    """The event loop may run a waiter's timer in the turn a wake admitted it:
    ``wait_for`` raises TimeoutError though the event was set. That waiter must not be
    asked again: admitted a second time, its share would count two requests and its reply
    end only one, leaving it running on the replica for good (a pressure run's 30 s
    waits: a replica idle while its queue waited for a room that share held)."""

    async def timer_wins(awaitable, timeout):  # the race's worst case, every time
        await awaitable
        raise TimeoutError

    monkeypatch.setattr("gateway.steps.working_set.asyncio.wait_for", timer_wins)
    pool = ReplicaPool([URLS[0]])
    for r in pool.replicas:
        r.healthy = True
        r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
    admission = WorkingSetAdmission(
        get_preset("cpu-tiny"), max_wait_s=60.0, reserve=False, pool_tokens=POOL_TOKENS,
        work_conserving=False,
    )  # fmt: skip
    clock = [100.0]
    gate = WorkingSetGate(admission, pool, clock=lambda: clock[0])
    member = await gate.admit("t", "a", URLS[0], 6_000)
    waiter = asyncio.create_task(gate.admit("t", "b", URLS[0], 6_000))
    while not admission.waiting:
        await asyncio.sleep(0)
    gate.finish(member, served=True)
    ticket = await waiter
    assert ticket.outcome == "waited"
    assert admission.members[URLS[0]][("t", "b")].running == 1
    gate.finish(ticket, served=True)
    assert ("t", "b") not in admission.members[URLS[0]]  # no share left running
