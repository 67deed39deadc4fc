"""Working-set admission and pause reservation: pure decisions over a snapshot of one
replica's KV pool and the sessions holding a share of it (no clock: ``now`` is passed in,
no I/O). The gateway's ``gateway.steps.working_set`` and the simulator call these.

vLLM v1 frees a finished request's blocks into its prefix cache (still hashed, first in
line for eviction) and counts them free in ``kv_cache_usage_perc``; a new request's prefill
evicts the oldest of them. A session in its tool pause therefore keeps its prefix only
while the prompts that arrive meanwhile fit in what is free. Admission keeps the sessions
whose prefixes fit the pool together (the working set) and makes any other wait, so the
sessions that will return find their prefix, instead of every session thrashing.

A session is in its replica's working set while a request of it runs there, or while its
pause reservation lasts: the footprint (its last prompt) is held for as long as the
session's own pauses say it will be gone, when bringing it back would cost more than an
engine step (``reservation_s``); a session idle past its reservation leaves the set.

Waiting is not free, though: while a replica's other sessions wait, its own members may all
be in their pauses and its engine idle. ``early_at`` lets the first waiter go when the
wait costs more than what admitting it costs (``CostModel``: the paused members' restores,
the running requests' slowdown), so the controller never idles an engine to save less than
the wait, and once it has waited that long (a ski rental's rule, since how long the wait
runs is not known); where only running requests hold the room, it goes to vLLM's own
queue, which sees their ends first.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from router.cost import CostModel

# The reservation covers the session's longest recent pause times this: a pause a little
# longer than the ones seen still finds its prefix.
PAUSE_SLACK = 1.5
# And at least this much beyond it: a pause is measured at the gateway (a reply's end to
# the next request), so it carries the harness's turnaround and the event loop's delays on
# a loaded node, tens to hundreds of milliseconds either way; for a quick pause (a harness
# that sends its next step at once) the slack alone is less than that jitter, and the
# session falls out of the set a moment before it returns. Holding a footprint a second
# longer costs a waiter at most that second (the ski rental bounds the rest).
PAUSE_JITTER_S = 1.0
# Pauses a session's history keeps (the most recent).
PAUSES_KEPT = 8


@dataclass(frozen=True, slots=True)
class Member:
    """A session's share of one replica's pool: ``tokens`` (its last prompt, what its
    prefix holds there), its requests running there, when its reservation ends, when its
    last request there ended (vLLM evicts the blocks freed longest ago first), and
    ``growth``: what its prompt grew by at its last step (an agent's history grows by each
    reply and tool output, so about that much again at its next)."""

    tokens: int
    running: int = 0
    reserved_until: float = 0.0
    ended_at: float = 0.0
    growth: int = 0

    def holds(self, now: float) -> bool:
        """In the working set: a request of it runs, or its reservation lasts."""
        return self.running > 0 or self.reserved_until > now


@dataclass(frozen=True, slots=True)
class Room:
    """One replica's KV pool as admission sees it: its size and what its last scrape said
    running requests use (vLLM's usage counts cached-but-free blocks as free)."""

    pool_tokens: int
    used_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Headroom:
    """Room a session entering the set leaves for the set's growth: ``steps`` steps of
    each member's last growth and of the entrant's own (``growth``). A set filled to the
    pool with today's prompts overflows at its members' next steps, and a member that grows
    past the room revokes the paused (``revoked``), who re-prefill their whole prefix when
    they are back: leaving the room for growth makes the newcomer wait instead, before it
    has a prefix to lose, or while its own is already gone."""

    steps: int
    growth: int = 0

    def tokens(self, holding: Mapping[Hashable, Member]) -> int:
        return self.steps * (self.growth + sum(m.growth for m in holding.values()))


def occupied_tokens(room: Room, members: Sequence[Member], now: float) -> int:
    """What the working set takes: running sessions (as scraped, or as this gateway counts
    them where the scrape lags) plus the reserved footprints of paused ones."""
    running = sum(m.tokens for m in members if m.running > 0)
    reserved = sum(m.tokens for m in members if m.running == 0 and m.reserved_until > now)
    return max(room.used_tokens, running) + reserved


def _others(
    members: Mapping[Hashable, Member], session: Hashable, now: float
) -> dict[Hashable, Member]:
    """The members holding a share of the pool now, but ``session`` itself."""
    return {k: m for k, m in members.items() if k != session and m.holds(now)}


def _fits(
    room: Room,
    holding: Mapping[Hashable, Member],
    tokens: int,
    now: float,
    fraction: float,
    headroom: Headroom | None = None,
) -> bool:
    """Whether ``tokens`` more fit beside ``holding`` in ``fraction`` of the pool, with
    ``headroom`` left for everyone's next steps where it is asked for."""
    need = occupied_tokens(room, list(holding.values()), now) + tokens
    if headroom is not None:
        need += headroom.tokens(holding)
    return need <= fraction * room.pool_tokens


def admits(
    room: Room,
    members: Mapping[Hashable, Member],
    session: Hashable,
    tokens: int,
    now: float,
    *,
    fraction: float,
    queued_ahead: int = 0,
    headroom: Headroom | None = None,
) -> bool:
    """Whether a request of ``session`` (``tokens`` of prompt) goes to the replica now.

    A member of the working set always goes (its prefix is held for it). Any other session
    goes when nobody queued before it for this replica (``queued_ahead``: first come first
    served) and its prompt fits beside the set in ``fraction`` of the pool, with
    ``headroom`` left for the set's growth; a replica whose set is empty takes anyone,
    however large, so no session waits for a pool it can never fit.
    """
    own = members.get(session)
    if own is not None and own.holds(now):
        return True
    if queued_ahead > 0:
        return False
    holding = _others(members, session, now)
    return not holding or _fits(room, holding, tokens, now, fraction, headroom)


def revoked(
    room: Room,
    members: Mapping[Hashable, Member],
    session: Hashable,
    tokens: int,
    now: float,
    *,
    fraction: float,
) -> list[Hashable]:
    """The paused members whose reservations a request that goes without room (its wait
    ran out) revokes, so that the set stays what the pool holds: those whose last request
    ended longest ago first, the order in which vLLM's free queue evicts their blocks
    (freed blocks join its tail, a new prefill takes from its head), until ``tokens`` fit
    beside the rest; every paused one when even that is not enough."""
    holding = _others(members, session, now)
    paused = sorted(
        (k for k, m in holding.items() if m.running == 0), key=lambda k: holding[k].ended_at
    )
    out: list[Hashable] = []
    for key in paused:
        if _fits(room, holding, tokens, now, fraction):
            break
        out.append(key)
        del holding[key]
    return out


def room_at(
    room: Room,
    members: Mapping[Hashable, Member],
    session: Hashable,
    tokens: int,
    now: float,
    *,
    fraction: float,
    headroom: Headroom | None = None,
) -> float | None:
    """The soonest the request fits beside the set by waiting (as ``admits`` counts room):
    when enough paused members' reservations have ended (soonest ending first) if none of
    them came back first; ``now`` when it fits already; None when the running members alone
    leave it no room (it then fits only once some of them end, which nothing here says
    when)."""
    holding = _others(members, session, now)
    ending = sorted(
        (k for k, m in holding.items() if m.running == 0), key=lambda k: holding[k].reserved_until
    )
    at = now
    for key in [None, *ending]:
        if key is not None:
            at = holding.pop(key).reserved_until
        if not holding or _fits(room, holding, tokens, now, fraction, headroom):
            return at
    return None


def eviction_s(
    room: Room,
    members: Mapping[Hashable, Member],
    session: Hashable,
    tokens: int,
    now: float,
    *,
    fraction: float,
    cost: CostModel,
) -> float:
    """What going now costs the paused members it evicts: the tokens past the set's share,
    taken from the members ``revoked`` names in vLLM's eviction order, each losing its
    prompt's tail (vLLM frees a finished request's blocks tail first, ``free_blocks(
    reversed(blocks))``, so the head of an evicted prefix still hits), brought back
    (``CostModel.restore_s``) when its session returns."""
    holding = _others(members, session, now)
    over = occupied_tokens(room, list(holding.values()), now) + tokens - fraction * room.pool_tokens
    total = 0.0
    for key in revoked(room, members, session, tokens, now, fraction=fraction):
        part = max(0, min(members[key].tokens, math.ceil(over)))
        total += cost.restore_s(part)
        over -= part
    return total


def early_at(
    room: Room,
    members: Mapping[Hashable, Member],
    session: Hashable,
    tokens: int,
    now: float,
    *,
    fraction: float,
    cost: CostModel,
    running: int,
    deadline: float,
    waited_s: float = 0.0,
    headroom: Headroom | None = None,
    own_tokens: int = 0,
) -> float:
    """When a request that does not fit beside the set (``admits`` said no) and is first
    in its replica's queue goes anyway, if nothing changes meanwhile: ``now`` when its wait
    costs more than going, else once it has waited as long as going costs.

    Both sides in seconds of the sessions' time, the one cost model's. Going costs the
    paused members it evicts their restores when they return (``eviction_s``), and each of
    the ``running`` requests on the replica the request's prefill, which vLLM v1's
    scheduler mixes chunk by chunk into the steps that decode them (running requests are
    scheduled first, a new prefill takes the step's remaining token budget), so every one of
    them runs that much slower. Waiting costs the request the time until room comes
    (``room_at``), counted from the soonest it can come: the paused members coming back
    within their reservations (what reservations are sized for) only makes the wait
    longer, so going is never a loss when it wins against this lower bound.

    Waiting also costs the request its own prefix, ``own_tokens`` of it left on the
    replica by its last request: outside the set its blocks are free-but-cached, freed
    before the paused members' (its reservation ended first), so they are the first a
    member's growing prompt evicts, and it re-prefills them when it goes. Going now keeps
    them (its prefill hits them, and only the rest slows what runs). A returning session
    therefore goes where evicting the members' tails costs no more than losing its own; a
    cold newcomer (none left) waits, as the working set is for.

    That bound is all that is known of the wait, and members that keep coming back within
    their reservations push the room out again and again (a set of cycling sessions holds
    an outsider until one of them ends). So the wait is also capped as a ski rental caps
    renting: the request goes once ``waited_s`` (its whole admission wait so far) reaches
    what going costs, which never pays more than twice the better of going at once and
    waiting for the room, whenever the room comes.

    With its members paused the replica runs nothing (``running`` 0): the engine time the
    restores take later is time it idles now, and the request goes whenever those restores
    cost less than the wait. Where room comes only past ``deadline`` (the end of the
    request's admission wait), waiting ends in a timeout that revokes the same paused
    sessions, so it goes now. So it does where the running members alone hold the room
    (``room_at`` None: no wait here ends before one of them does): vLLM's scheduler then
    holds it in its own queue until a running request frees blocks, and sees that end the
    moment it comes, which the gateway learns only at the reply's end; it never preempts a
    running request to admit a waiting one (preemption is only for a running request's own
    next blocks, and takes the newest first, this one). Room is counted as ``admits``
    counts it (``headroom``)."""
    at = room_at(room, members, session, tokens, now, fraction=fraction, headroom=headroom)
    if at is None or at >= deadline:
        return now
    going = eviction_s(room, members, session, tokens, now, fraction=fraction, cost=cost)
    own = min(own_tokens, tokens)
    going += running * cost.prefill_s(tokens - own)  # its own prefix hits: not prefilled
    going -= cost.restore_s(own)
    if going < at - now:
        return now
    return now + max(0.0, going - waited_s)


def next_release(members: Mapping[Hashable, Member], now: float) -> float | None:
    """When the earliest reservation of an idle member ends (the set may then take a waiting
    session); None when none is pending."""
    ends = [m.reserved_until for m in members.values() if m.running == 0 and m.reserved_until > now]
    return min(ends, default=None)


def expected_pause_s(pauses: Sequence[float], prior_s: float) -> float:
    """The pause to plan for: the longest of the session's recent pauses (request end to
    its next request); ``prior_s`` before its first. Agents' pauses are bimodal (a quick
    read, then a tool run of seconds): a quantile plans for the quick ones and drops the
    prefix in every tool run, the pause whose re-prefill is what the reservation is for;
    holding longer costs only when the pause is long and another session waits for the
    room (``reservation_max_s`` bounds it)."""
    return max(pauses, default=prior_s)


def reservation_s(expected_pause: float, tokens: int, cost: CostModel, max_s: float) -> float:
    """How long a session's footprint stays reserved after its request: its expected pause
    with slack (``PAUSE_SLACK``, at least ``PAUSE_JITTER_S``), at most ``max_s``; 0 when
    bringing it back after an eviction (re-prefill or, with an offload tier, reload:
    ``CostModel.restore_s``) costs no more than one engine step beyond the step its next
    request runs in anyway."""
    if cost.restore_s(tokens) <= 2 * cost.per_step_s:
        return 0.0
    return min(max_s, max(PAUSE_SLACK * expected_pause, expected_pause + PAUSE_JITTER_S))
