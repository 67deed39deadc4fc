"""The gateway computes every hint its policies read: the shared prefix (tools and leading
system messages of the rendered prompt) keyed per tenant, only for a policy that reads it;
with the KV events, the prompt in the replica's tokens, and each attempt's prefill counted
on its replica until the first chunk."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.config import GatewayConfig
from gateway.fold.renderer import RenderStats
from gateway.fold.spec import parse_spec
from gateway.identity import Caller
from gateway.request_cache import Decoded
from gateway.steps import route
from gateway.steps.forward import Forward
from gateway.steps.ingest import Ingested
from gateway.steps.kv import KvControl
from gateway.steps.render_call import Rendering
from gateway.tokens import BYTES_PER_TOKEN, estimate_tokens, serialize_tools
from gateway.transcript import Message, Text, Transcript
from router import ReplicaPool, RouteHints, get_preset, make_policy, make_tenant_policy
from router.session_route import prefill_estimate, shared_prefix
from store import Lookup
from tests.router.support import NoStore

TOOLS = ({"type": "function", "function": {"name": "bash", "parameters": {}}},)


def sent(tenant: str, system: str, user: str, tools: tuple = TOOLS) -> tuple[Ingested, Rendering]:
    messages = (Message("system", (Text(system),)), Message("user", (Text(user),)))
    decoded = Decoded.full(Transcript(messages, tools=tools))
    ingested = Ingested(
        caller=Caller(tenant, parse_spec("base"), "auto", budget=None, max_bytes=None),
        session="s",
        decoded=decoded,
        found=Lookup(None, 0, {}, {route.LAST_PROMPT: 1234}, "http://replica-1:8000"),
        stream=True,
    )
    return ingested, Rendering(decoded.transcript, decoded.tokens, RenderStats(), 0.0, None)


STICKY_COST = make_policy("sticky_cost", assignments=NoStore(), cost=get_preset("cpu-tiny"))


def test_the_gateway_sets_the_shared_prefix_a_cost_policy_reads() -> None:
    ingested, rendering = sent("acme", "You are a coding agent. " * 50, "fix bug 1")
    hints = route.hints(STICKY_COST, ingested, rendering, ingested.found.assignment)
    assert hints.prefix_key is not None
    # The tool schemas and the system prompt, in the gateway's estimate.
    system = rendering.transcript.messages[0]
    tools = len(serialize_tools(TOOLS).encode()) // BYTES_PER_TOKEN
    assert hints.prefix_tokens == estimate_tokens(system) + tools
    assert hints.cached_prefix_tokens == 1234
    assert (hints.assignment, hints.assignment_read) == ("http://replica-1:8000", True)
    assert hints.prompt_tokens == rendering.tokens


def test_one_agent_shares_one_key_and_another_agent_or_tenant_does_not() -> None:
    system = "You are a coding agent. " * 50

    def key(tenant: str, system: str, user: str, tools: tuple = TOOLS) -> str | None:
        ingested, rendering = sent(tenant, system, user, tools)
        return route.hints(STICKY_COST, ingested, rendering, None).prefix_key

    one = key("acme", system, "fix bug 1")
    assert key("acme", system, "fix bug 2") == one  # another task of the same agent
    assert key("acme", system + " Be brief.", "fix bug 1") != one  # another system prompt
    assert key("acme", system, "fix bug 1", tools=()) != one  # other tools
    # Tenant isolation: the replicas salt each tenant's cache apart, so the same agent of
    # another tenant shares no prefix with this one, and its key must not name this one's.
    assert key("globex", system, "fix bug 1") != one


def test_a_policy_that_reads_no_prefix_gets_none_and_costs_nothing() -> None:
    ingested, rendering = sent("acme", "system", "hello")
    sticky = make_policy("sticky", assignments=NoStore())
    hints = route.hints(sticky, ingested, rendering, None)
    assert (hints.prefix_key, hints.prefix_tokens, hints.cached_prefix_tokens) == (None, 0, None)
    # Per tenant: a tenant on sticky_cost gets it, the others do not.
    per_tenant = make_tenant_policy(
        "sticky", {"acme": "sticky_cost"}, assignments=NoStore(), cost=get_preset("cpu-tiny")
    )
    assert route.hints(per_tenant, ingested, rendering, None).prefix_key is not None
    other, other_rendering = sent("globex", "system", "hello")
    assert route.hints(per_tenant, other, other_rendering, None).prefix_key is None


@pytest.mark.parametrize("tools", [(), TOOLS])
def test_a_prompt_without_system_messages_shares_only_its_tools(tools: tuple) -> None:
    decoded = Decoded.full(Transcript((Message("user", (Text("hi"),)),), tools=tools))
    found = shared_prefix("acme", decoded.transcript)
    assert (found is None) == (not tools)


async def test_with_the_kv_events_the_prompt_is_sized_in_the_replicas_tokens() -> None:
    """The events count the replica's tokens; the prompt whose unheld part is the request's
    prefill (``prefill_estimate``) is taken in those too: the gateway's estimate scaled by
    what the replica counted of the session's earlier prompts (``replica_tokens``)."""
    ingested, rendering = sent("acme", "You are a coding agent. " * 50, "fix bug 1")
    # The replica counted 1.5 tokens for every one the gateway estimated.
    counts = {route.LAST_PROMPT: 1234, "rendered_tokens": 1000, "upstream_prompt_tokens": 1500}
    ingested = replace(ingested, found=replace(ingested.found, counts=counts))
    hints = route.hints(STICKY_COST, ingested, rendering, ingested.found.assignment)
    home = "http://replica-1:8000"
    control = KvControl(GatewayConfig(), ReplicaPool([home]), None)  # type: ignore[arg-type]
    placed = await control.place(ingested, hints)  # no events: the hints as they were
    assert placed.hints.prompt_tokens == rendering.tokens
    assert prefill_estimate(placed.hints, home) is None
    control.resident = lambda ingested, key: {home: 100}  # type: ignore[method-assign]
    placed = await control.place(ingested, hints)
    assert placed.hints.prompt_tokens == round(rendering.tokens * 1.5)
    assert prefill_estimate(placed.hints, home) == round(rendering.tokens * 1.5) - 100


class FirstChunkUpstream:
    """An upstream whose first chunk comes back at once: it records, when asked, what the
    replica's backlog held; its stream's whole reply is read later (a client that waits
    for it) and records the backlog then."""

    def __init__(self, pool: ReplicaPool) -> None:
        self.replica = pool.replicas[0]
        self.seen: list[tuple[str, int, int]] = []

    async def open_chat_stream(self, url: str, body: object) -> FirstChunkUpstream:
        self.seen.append(("sent", self.replica.prefilling, self.replica.prefill_backlog_tokens))
        return self

    async def read_whole(self) -> None:
        self.seen.append(("read", self.replica.prefilling, self.replica.prefill_backlog_tokens))

    def close(self) -> None:
        return None


@pytest.mark.parametrize("stream", [True, False])
async def test_the_attempt_counts_its_sized_prefill_until_the_first_chunk(stream: bool) -> None:
    home = "http://replica-1:8000"
    pool = ReplicaPool([home])
    pool.replicas[0].healthy = True
    upstream = FirstChunkUpstream(pool)
    forward = Forward(GatewayConfig(), pool, make_policy("round_robin"), upstream, None, None)  # type: ignore[arg-type]
    ingested, _ = sent("acme", "You are a coding agent. " * 50, "fix bug 1")
    ingested = replace(ingested, stream=stream)
    # The KV events say the replica holds 3,000 of the 5,000 prompt tokens: 2,000 to prefill.
    hints = RouteHints(prompt_tokens=5000, resident_tokens={home: 3000})
    await forward.open(ingested, {}, hints)
    # Counted while it waits for its first chunk; not while a whole reply is read after it.
    read = [("read", 0, 0)] if not stream else []
    assert upstream.seen == [("sent", 1, 2000), *read]
    # Without the events' figures nothing is sized.
    upstream.seen.clear()
    await forward.open(ingested, {}, RouteHints(prompt_tokens=5000))
    assert upstream.seen[0] == ("sent", 0, 0)
