"""What a routing decision sees: the request's hints, a snapshot of each replica, and what
the policy around the decision read about the session. Plain frozen values, so a decision
over them is a pure function."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.replica import Replica


@dataclass(frozen=True, slots=True)
class RouteHints:
    """What the gateway knows about a request beyond its session id.

    ``prompt_tokens``: the rendered prompt's tokens. ``cached_prefix_tokens``: how much of
    the session's prompt its replica holds, from the store's per-session accounting (the
    previous request's prompt); None when unknown. ``prefix_key``: names a prefix other
    sessions share (a digest of tenant, tools and system prompt: the same agent,
    ``router.session_route.shared_prefix``), of ``prefix_tokens`` tokens.
    ``block_chain``: the prompt's chained block keys, which only the simulator has (for its
    model of vllm-router's ``cache_aware``; the gateway offers no policy that reads them).
    ``assignment_read``: the caller read the session's assignment (``assignment``) with its
    own store read and writes the chosen replica back with its own store write, so a sticky
    policy neither reads nor writes it (the gateway shares those round trips with the
    session's history). ``resident_tokens``: per replica URL, how much of the session's
    last prefix the replica still holds, from its KV events (``router.kv_events``); None
    when the gateway does not follow them. ``admitted``: the replica working-set admission
    placed the request on, by room or after a wait for room there (``router.admission_seam.
    binds_placement``); the decision takes it while it is a candidate, since a move would
    throw that wait away and overflow a set that did not count it.
    """

    prompt_tokens: int = 0
    cached_prefix_tokens: int | None = None
    prefix_key: str | None = None
    prefix_tokens: int = 0
    assignment: str | None = None
    assignment_read: bool = False
    block_chain: Sequence[int] | None = field(default=None, compare=False)
    resident_tokens: Mapping[str, int] | None = None
    admitted: str | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica as the scorers see it: a snapshot, not the live object."""

    url: str
    running: float
    waiting: float
    in_flight: int
    kv_usage: float | None
    bound_sessions: int
    kv_pool_tokens: int | None = None  # scraped (vllm:cache_config_info); None: unknown
    # This gateway's requests there awaiting their first token whose prefill it sized, and
    # that prefill's tokens (``Replica.prefilling``, ``prefill_backlog_tokens``).
    prefilling: int = 0
    prefill_backlog_tokens: int = 0

    @property
    def load(self) -> float:
        """Scraped running + waiting plus this gateway's in-flight requests (Replica.load)."""
        return self.running + self.waiting + self.in_flight

    @property
    def queued(self) -> float:
        """Requests ahead of a new one: the scraped queue, plus in-flight requests the last
        scrape cannot have seen yet (more in flight than the engine held)."""
        return self.waiting + max(0.0, self.in_flight - self.running - self.waiting)


def snapshot(replica: Replica, bound_sessions: int = 0) -> Candidate:
    """The replica's latest scrape and in-flight count, with the sessions bound to it."""
    m = replica.metrics
    return Candidate(
        url=replica.url,
        running=m.running if m is not None else 0.0,
        waiting=m.waiting if m is not None else 0.0,
        in_flight=replica.in_flight,
        kv_usage=m.kv_cache_usage if m is not None else None,
        bound_sessions=bound_sessions,
        kv_pool_tokens=m.kv_pool_tokens if m is not None else None,
        prefilling=replica.prefilling,
        prefill_backlog_tokens=replica.prefill_backlog_tokens,
    )


@dataclass(frozen=True, slots=True)
class RouteContext:
    """One request as the filters, scorers and picker see it."""

    tenant: str
    session: str
    hints: RouteHints
    current: str | None = None  # the session's assigned replica, when usable
    prefix_home: str | None = None  # where the shared prefix was last served
    # How many turns the profile's rotation has taken: pickers that rotate over ties
    # start from it (the policy keeps the count; the picker only reads it).
    turn: int = 0
    # Every replica URL in the pool, routable or not (a hash ring is laid over all).
    replicas: frozenset[str] = frozenset()
    # Tokens of this prompt each replica's approximate prefix tree matches (cache_aware).
    matched: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouteInput:
    """Everything one decision depends on.

    ``candidates``: the replicas the request may go to (routable, not excluded), as
    snapshots. ``replicas``: every replica URL in the pool and ``exclude`` the URLs failover
    already tried, to tell why an assigned replica cannot keep its session. ``assignment``:
    the session's replica as read from the store (None for a new session, or for a policy
    that keeps none). ``turns``: each rotation's count of turns taken so far.
    ``matched``: per replica URL, the tokens of this prompt its approximate prefix tree
    matches (only for a policy that keeps one).
    """

    tenant: str
    session: str
    hints: RouteHints
    candidates: tuple[Candidate, ...]
    replicas: frozenset[str]
    exclude: frozenset[str] = frozenset()
    assignment: str | None = None
    prefix_home: str | None = None
    turns: Mapping[str, int] = field(default_factory=dict)
    matched: Mapping[str, int] = field(default_factory=dict)
