"""A session as its owner sees it: what it cost, and what the model saw at each request.

Figures come from the branch ledgers (``gateway.accounting``) and the router's assignment.
What the model saw at request N is rendered again from the stored history, which never
changes: a record keeps how many history messages its request carried and what else its
rendering depended on (strategy, fold mode, KV pressure, tools). ReFold decides a rewrite
as of the request that made it, under that request's pressure, and keeps the decision in
its per-session cache; so the view replays the branch's requests of the same strategy in
order, cache threaded through, as the gateway rendered them (a gateway that lost its cache,
after a restart or on another gateway replica, renders cold under the pressure of the
moment and may have decided otherwise). The view is each request's last attempt: restore
exchanges the gateway answered during it are in it.

Each rendering says where its messages came from (``Rendered.sources`` and ``kinds``:
the history index, or none for a message the strategy added, and what the strategy made of
it), so the view shows that beside the history; a composition traces through its parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway import accounting
from gateway.accounting import Ledger, RequestRecord
from gateway.fold.renderer import Rendered, Renderer, RenderState, step_indices
from gateway.steps.ingest import with_gateway_turns
from gateway.tokens import BYTES_PER_TOKEN, estimate_tokens
from gateway.transcript import Message, Opaque, Transcript
from store import NotFound, SessionStore


class NoSuchRequest(LookupError):
    """The session's branch has no request with that number."""


async def _ledgers(store: SessionStore, tenant: str, session: str) -> list[Ledger]:
    """Every branch's ledger, by branch id (branches are numbered from 0 without gaps)."""
    ledgers = [await accounting.read(store, tenant, session, 0)]
    while True:
        try:
            ledgers.append(await accounting.read(store, tenant, session, len(ledgers)))
        except NotFound:
            return ledgers


async def summary(store: SessionStore, tenant: str, session: str) -> dict[str, Any]:
    """Totals over every branch; the current rendering's counts from the head's last request.

    Raises ``store.NotFound`` for a session the tenant does not have.
    """
    head = (await store.load(tenant, session, None, messages=False)).branch_id
    ledgers = await _ledgers(store, tenant, session)
    totals = {name: sum(ledger.totals[name] for ledger in ledgers) for name in accounting.SUMMED}
    last = ledgers[head].log[-1] if ledgers[head].log else None
    prompt = totals["upstream_prompt_tokens"]
    return {
        "id": session,
        "object": "session",
        "head_branch": head,
        "branches": len(ledgers),
        **totals,
        "saved_tokens": totals["raw_tokens"] - totals["rendered_tokens"],
        "cached_ratio": round(totals["upstream_cached_tokens"] / prompt, 4) if prompt else None,
        "strategy": last.strategy if last else None,
        "stubs": last.stubs if last else 0,
        "folds": last.folds if last else 0,
        "compactions": last.compactions if last else 0,
        "replica": await store.get_assignment(tenant, session),
        "last_request_at": last.at if last else None,
    }


async def summaries(
    store: SessionStore, tenant: str, limit: int, after: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of at most ``limit`` of the tenant's sessions, most recently used first, from
    the cursor ``after`` (one that expires meanwhile is left out), and the next page's cursor
    (None after the last page)."""
    page = await store.session_page(tenant, limit, after)
    out = []
    for session in page.sessions:
        try:
            out.append(await summary(store, tenant, session))
        except NotFound:
            continue
    return out, page.next


async def detail(
    store: SessionStore, tenant: str, session: str, branch: int | None = None
) -> dict[str, Any]:
    """The summary plus one branch's requests (default: the head's)."""
    out = await summary(store, tenant, session)
    branch = out["head_branch"] if branch is None else branch
    ledger = await accounting.read(store, tenant, session, branch)
    out["branch"] = branch
    out["log"] = [{"request": n, **asdict(r)} for n, r in enumerate(ledger.log, 1)]
    return out


async def request_view(
    store: SessionStore,
    renderer_for: Callable[[str, str], Renderer],
    tenant: str,
    session: str,
    request: int,
    branch: int | None = None,
) -> dict[str, Any]:
    """What the model saw at request ``request`` (1-based) of a branch, beside the history.

    ``renderer_for(strategy, fold)`` gives the gateway's renderer. Raises ``store.NotFound``
    for an unknown session or branch, ``NoSuchRequest`` for a request number the branch has
    not had.
    """
    stored = await store.load(tenant, session, branch)
    ledger = await accounting.read(store, tenant, session, stored.branch_id)
    if not 1 <= request <= len(ledger.log):
        raise NoSuchRequest(
            f"session {session!r} branch {stored.branch_id} has {len(ledger.log)} requests, "
            f"no request {request}"
        )
    messages = [Message.from_dict(m) for m in stored.messages]
    log = ledger.log[:request]
    inputs = [_Input.of(record, messages, stored.gateway_turns) for record in log]
    traced = replay(renderer_for, inputs, wanted=len(inputs) - 1)
    previous = None
    if request > 1:
        previous = replay(renderer_for, inputs[:-1], wanted=len(inputs) - 2).rendered
    return _view(session, stored.branch_id, request, inputs[-1], traced, previous, log)


@dataclass(frozen=True, slots=True)
class _Input:
    """One request as its renderer saw it."""

    record: RequestRecord
    history: Transcript
    state: RenderState

    @classmethod
    def of(cls, record: RequestRecord, messages: Sequence[Message], turns: Any) -> _Input:
        history, restored = with_gateway_turns(messages[: record.messages], turns)
        # Renderers read only whether tools were offered (ReFold then adds its own).
        tools = tuple({"type": "function", "function": {"name": n}} for n in record.tools)
        state = RenderState(restored=frozenset(restored), pressure=record.pressure)
        return cls(record, Transcript(tuple(history), tools), state)


@dataclass(frozen=True, slots=True)
class Traced:
    """A rendering, each rendered message's history index (None: the renderer added it),
    and its kind: verbatim, labelled (content kept, the gateway added a label or a note),
    stub, fold, summary, masked, clipped, rewritten, or added."""

    rendered: Rendered
    sources: list[int | None]
    kinds: list[str]


def replay(
    renderer_for: Callable[[str, str], Renderer], inputs: Sequence[_Input], wanted: int
) -> Traced:
    """Request ``wanted`` of ``inputs`` rendered as the gateway did: after every earlier
    request of the same strategy, with the renderer's cache carried from one to the next."""
    strategy = inputs[wanted].record.strategy
    same = [i for i in inputs[: wanted + 1] if i.record.strategy == strategy]
    renderers = [renderer_for(i.record.strategy, i.record.fold) for i in same]
    return trace(renderers, [(i.history, i.state) for i in same])


def trace(
    renderers: Sequence[Renderer], inputs: Sequence[tuple[Transcript, RenderState | None]]
) -> Traced:
    """The last of successive renderings (``renderers[i]`` renders ``inputs[i]``, each
    given the cache the one before returned), traced back to its history."""
    cache = None
    for renderer, (history, state) in zip(renderers, inputs, strict=True):
        rendered = renderer.render(history, state, cache)
        cache = rendered.cache
    return Traced(rendered, list(rendered.sources), list(rendered.kinds))


def _view(
    session: str,
    branch: int,
    request: int,
    given: _Input,
    traced: Traced,
    previous: Rendered | None,
    log: Sequence[RequestRecord],
) -> dict[str, Any]:
    history = list(given.history.messages)
    restored = given.state.restored
    steps = step_indices(given.history, given.state)
    step_of = {position: n for n, position in enumerate(steps)}
    out = traced.rendered.transcript.messages
    used = {s for s in traced.sources if s is not None}
    stats = traced.rendered.stats
    boundary_at = steps[stats.boundary] if stats.boundary < len(steps) else len(history)
    return {
        "object": "session.render",
        "session": session,
        "branch": branch,
        "request": request,
        "record": asdict(given.record),
        "tools": accounting.tool_names(traced.rendered.transcript.tools),
        "history": [
            {
                **_message(m),
                "index": h,
                "step": step_of.get(h),
                "gateway": h in restored or _is_restore_call(history, restored, h),
                "rendered": h in used,
            }
            for h, m in enumerate(history)
        ],
        "rendered": [
            {**_message(m), "index": i, "source": s, "kind": k, "tokens": estimate_tokens(m)}
            for i, (m, s, k) in enumerate(zip(out, traced.sources, traced.kinds, strict=True))
        ],
        "tokens": {
            "history": sum(estimate_tokens(m) for m in history),
            "rendered": sum(estimate_tokens(m) for m in out),
        },
        "stats": {
            "steps": stats.steps,
            "boundary": stats.boundary,
            "stubs": stats.stubs,
            "folded_steps": stats.folded_steps,
            "compactions": stats.compactions,
            "reminders": stats.reminders,
            "rewrites": stats.rewrites,
            "overhead_tokens": stats.overhead_tokens,
            "stub_saved_tokens": stats.stub_saved_tokens,
            "fold_saved_tokens": stats.fold_saved_tokens,
            "notes": list(stats.notes),
        },
        "chunk_boundary": {
            "step": stats.boundary,
            "rendered_index": next(
                (i for i, s in enumerate(traced.sources) if s is not None and s >= boundary_at),
                len(out),
            ),
        },
        "cached_prefix": _shared_prefix(out, previous, log),
    }


def _is_restore_call(history: list[Message], restored: list[int], h: int) -> bool:
    """The assistant message right before a restored one is the model's restore request."""
    return history[h].role == "assistant" and (h + 1) in restored


def _message(m: Message) -> dict[str, Any]:
    return {
        "role": m.role,
        "text": m.text,
        "thinking": m.thinking,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
        ],
        "tool_call_id": m.tool_call_id,
        "attachments": sum(1 for p in m.parts if isinstance(p, Opaque)),
    }


def _shared_prefix(
    messages: Sequence[Message], previous: Rendered | None, log: Sequence[RequestRecord]
) -> dict[str, Any] | None:
    """How much of this rendering the previous request sent identically: what the replica's
    prefix cache could serve (vLLM caches whole blocks, so a little less in practice)."""
    if previous is None:
        return None
    before = previous.transcript.messages
    same = 0
    while same < min(len(messages), len(before)) and messages[same] == before[same]:
        same += 1
    chars = 0
    if same < min(len(messages), len(before)) and messages[same].role == before[same].role:
        a, b = messages[same].text, before[same].text
        while chars < min(len(a), len(b)) and a[chars] == b[chars]:
            chars += 1
    return {
        "messages": same,
        "chars": chars,
        "tokens": sum(estimate_tokens(m) for m in messages[:same]) + chars // BYTES_PER_TOKEN,
        "same_replica": log[-2].replica == log[-1].replica,
    }
