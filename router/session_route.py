"""One request's routing path around the policy, as the gateway and the simulator both run it.

The gateway reads a session's assignment with its history (one store read), builds the
request's hints (``route_hints``), lets the policy decide with ``assignment_read`` set (the
policy then touches no store), asks the admission seam whether the request may go to the
chosen replica now, counts it in flight there, and writes the assignment with the history
once the replica accepted the request (``assignment_write``: a compare-and-set against the
value read). The simulator calls these same functions in the same order
(``offline.sim.routing``), so a simulated policy is the deployed one.

Everything here is a pure function of its inputs (no I/O, no clock): the callers bring the
store's answer and the time.

``shared_prefix``: the hint the prefix scorer reads, a key of what sessions of one agent
share at the start of their prompts (the tool schemas and the leading system messages),
scoped by tenant (the replicas' ``cache_salt`` keeps tenants' caches apart, so a prefix is
never shared across tenants), and its size in the gateway's token estimate.

Before the decision both callers ask the admission seam (``router.admission_seam``)
whether the request may go now. ``with_resident`` and ``session_warm``: what the replicas'
KV (the gateway's KV events, the simulator's exact blocks) adds to the hints, and whether
the session runs at vLLM's warm priority.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.tokens import BYTES_PER_TOKEN, estimate_tokens, serialize_tools
from gateway.transcript import Transcript
from router.inputs import RouteHints
from router.policies import AssignedSessionPolicy, RoutingPolicy
from store import Assign


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """What sessions of one agent share: ``key`` names it (per tenant), ``tokens`` its size."""

    key: str
    tokens: int


def shared_prefix(tenant: str, transcript: Transcript) -> SharedPrefix | None:
    """The tool schemas and the leading system messages of ``transcript`` as a key scoped
    by ``tenant``, with their estimated tokens; None when the prompt starts with neither."""
    tools = serialize_tools(transcript.tools).encode()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(tenant.encode())
    digest.update(b"\0")
    digest.update(tools)
    tokens = len(tools) // BYTES_PER_TOKEN
    for message in transcript.messages:
        if message.role != "system":
            break
        digest.update(b"\0")
        digest.update(message.text.encode())
        tokens += estimate_tokens(message)
    if tokens == 0:
        return None
    return SharedPrefix(digest.hexdigest(), tokens)


def route_hints(
    policy: RoutingPolicy,
    tenant: str,
    *,
    prompt_tokens: int,
    last_prompt_tokens: int | None,
    assignment: str | None,
    prefix: Callable[[], SharedPrefix | None],
    block_chain: Sequence[int] | None = None,
) -> RouteHints:
    """The hints for one request of ``tenant``'s session: the rendered prompt's size, the
    session's cached prefix (its last prompt, from the store's counters) when the tenant's
    policy prices moves with it, the shared prefix (``prefix()``, computed only when the
    policy reads it), and the ``assignment`` the caller read (so the policy neither reads
    nor writes it). ``block_chain``: the prompt's chained block keys, which only the
    simulator has (its ``cache_aware`` model of vllm-router reads them)."""
    chosen = policy.policy_for(tenant)
    found = prefix() if chosen.uses_shared_prefix else None
    return RouteHints(
        prompt_tokens=prompt_tokens,
        cached_prefix_tokens=last_prompt_tokens if chosen.uses_cached_prefix else None,
        prefix_key=found.key if found else None,
        prefix_tokens=found.tokens if found else 0,
        assignment=assignment,
        assignment_read=True,
        block_chain=block_chain,
    )


def assignment_write(
    policy: RoutingPolicy, tenant: str, replica: str, expected: str | None
) -> Assign | None:
    """The assignment to write with the history once ``replica`` accepted the request: in
    place of ``expected`` (as read, or as this request's last write left it), for the
    policy's TTL; None when the tenant's policy keeps no sessions on replicas."""
    chosen = policy.policy_for(tenant)
    if not isinstance(chosen, AssignedSessionPolicy):
        return None
    return Assign(replica, expected=expected, ttl_s=chosen.ttl_s)


def with_resident(
    hints: RouteHints, home: str | None, resident: Mapping[str, int] | None
) -> RouteHints:
    """The hints with what each replica holds of the session's last prefix (``resident``,
    None without KV events): for the ``kv_resident`` scorer, and as the cached prefix on
    its own replica ``home`` where the policy prices moves with it."""
    if resident is None:
        return hints
    hints = replace(hints, resident_tokens=dict(resident))
    if home in resident and hints.cached_prefix_tokens is not None:
        hints = replace(hints, cached_prefix_tokens=resident[home])
    return hints


def prefill_estimate(hints: RouteHints, replica: str) -> int | None:
    """The prompt tokens a request sends to ``replica`` that it does not hold: the prompt
    less what the KV events say the replica holds of the session's last prefix; None
    without the events (what a replica still holds is not known then)."""
    if hints.resident_tokens is None:
        return None
    return max(0, hints.prompt_tokens - hints.resident_tokens.get(replica, 0))


def session_warm(
    home: str | None,
    last_prompt_tokens: int | None,
    resident: Mapping[str, int] | None,
    holds: Callable[[], bool] | None,
) -> bool:
    """Whether a continuing session's prefix is warm on its replica ``home``: when anything
    the gateway knows says it is there (its working-set membership, ``holds``, or at least
    half of its last prompt resident by the KV events' figure), else, knowing neither,
    that it continues there at all."""
    if home is None or not last_prompt_tokens:
        return False
    known = []
    if holds is not None:
        known.append(holds())
    if resident is not None and home in resident:
        known.append(2 * resident[home] >= last_prompt_tokens)
    return any(known) if known else True
