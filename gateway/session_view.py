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

Renderers do not say which history message each rendered message came from, so the view
traces it: strategies either rewrite messages in place (possibly adding some before them)
or replace a run of messages by a summary (a cliff). A composition is traced stage by
stage. ReFold's cache names its folded steps; its other rewritten outputs hold stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway import accounting
from gateway.accounting import Ledger, RequestRecord
from gateway.fold.compose import Composed, merge_stats
from gateway.fold.refold import ReFold
from gateway.fold.renderer import Rendered, Renderer, RenderState, estimate_tokens, step_indices
from gateway.steps.ingest import with_gateway_turns
from gateway.transcript import Message, Opaque, Transcript
from store import NotFound, SessionStore

# What a stage's rewritten and added messages are called in a view (ReFold's: stub, fold).
_REWRITE_KIND = {"mask": "masked", "clip": "clipped"}
_ADDED_KIND = {"cliff": "summary"}


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


async def summaries(store: SessionStore, tenant: str) -> list[dict[str, Any]]:
    """The tenant's sessions, most recently used first (one that expires meanwhile is left out)."""
    out = []
    for session in reversed(await store.list_sessions(tenant)):
        try:
            out.append(await summary(store, tenant, session))
        except NotFound:
            continue
    return out


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
    return _traced(renderers, inputs)[1]


def _traced(
    renderers: Sequence[Renderer], inputs: Sequence[tuple[Transcript, RenderState | None]]
) -> tuple[list[Rendered], Traced]:
    """Every rendering, and the last one traced."""
    last = renderers[-1]
    if isinstance(last, Composed):
        inner, inner_traced = _traced([r.inner for r in renderers], inputs)  # type: ignore[attr-defined]
        outer, outer_traced = _traced(
            [r.outer for r in renderers],  # type: ignore[attr-defined]
            [(rendered.transcript, None) for rendered in inner],
        )
        both = [
            Rendered(o.transcript, None, merge_stats(i, o))
            for i, o in zip(inner, outer, strict=True)
        ]
        sources = [None if s is None else inner_traced.sources[s] for s in outer_traced.sources]
        kinds = [
            inner_traced.kinds[s] if s is not None and k in {"verbatim", "labelled"} else k
            for s, k in zip(outer_traced.sources, outer_traced.kinds, strict=True)
        ]
        return both, Traced(both[-1], sources, kinds)
    renderings: list[Rendered] = []
    cache = None
    for renderer, (history, state) in zip(renderers, inputs, strict=True):
        renderings.append(renderer.render(history, state, cache))
        cache = renderings[-1].cache
    rendered = renderings[-1]
    history = inputs[-1][0].messages
    out = rendered.transcript.messages
    sources = align(history, out)
    folded = _folded_positions(rendered) if isinstance(last, ReFold) else set()
    kinds = []
    for m, s in zip(out, sources, strict=True):
        if s is None:
            kinds.append(_ADDED_KIND.get(last.name, "added"))
        elif m == history[s]:
            kinds.append("verbatim")
        elif keeps_content(history[s], m):
            kinds.append("labelled")
        elif isinstance(last, ReFold):
            kinds.append("fold" if s in folded else "stub")
        else:
            kinds.append(_REWRITE_KIND.get(last.name, "rewritten"))
    return renderings, Traced(rendered, sources, kinds)


def _folded_positions(rendered: Rendered) -> set[int]:
    """History positions of the steps ReFold folded (its cache keeps them)."""
    cache = rendered.cache
    steps = getattr(cache, "steps", [])
    return {steps[s] for s in getattr(cache, "folded", ()) if s < len(steps)}


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
        "tokens": sum(estimate_tokens(m) for m in messages[:same]) + chars // 4,
        "same_replica": log[-2].replica == log[-1].replica,
    }


# -- tracing rendered messages back to the history ---------------------------------------


def align(history: Sequence[Message], rendered: Sequence[Message]) -> list[int | None]:
    """For each rendered message, the history index it renders, or None when added.

    Identical leading and trailing messages pair up; in between, a rendering at least as
    long as the history rewrote it in place after its added messages, and a shorter one
    replaced the run (its messages are added, the run's history messages dropped).
    """
    n, r = len(history), len(rendered)
    head = 0
    while head < min(n, r) and rendered[head] == history[head]:
        head += 1
    tail = 0
    while tail < min(n, r) - head and rendered[r - 1 - tail] == history[n - 1 - tail]:
        tail += 1
    middle_h, middle_r = n - head - tail, r - head - tail
    sources: list[int | None] = [*range(head), *([None] * middle_r), *range(n - tail, n)]
    if middle_r >= middle_h:
        added = middle_r - middle_h
        for j in range(middle_h):
            h, i = head + j, head + added + j
            if _same_slot(history[h], rendered[i]):
                sources[i] = h
    return sources


def _same_slot(a: Message, b: Message) -> bool:
    """Could ``b`` be ``a`` rewritten: same role, same call it answers, same calls it makes."""
    return (
        a.role == b.role
        and a.tool_call_id == b.tool_call_id
        and [c.id for c in a.tool_calls] == [c.id for c in b.tool_calls]
    )


def keeps_content(original: Message, rendered: Message) -> bool:
    """``rendered`` still holds all of ``original``'s text, thinking and calls."""
    return (
        original.text in rendered.text
        and original.thinking == rendered.thinking
        and original.tool_calls == rendered.tool_calls
    )
