"""A session as its owner sees it: what it cost, and what the model saw at each request.

Figures come from the branch ledgers (``gateway.accounting``) and the router's assignment.
What the model saw at request N is rendered again: the history never changes, a record
keeps how many history messages the request carried, and a renderer is a pure function of
(history, render state). The view is the request's last attempt, restore exchanges that
the gateway answered during it included.

Renderers do not say which history message each rendered message came from, so the view
traces it: strategies either rewrite messages in place (possibly adding some before them,
as ReFold adds its protocol prompt) or replace a run of messages by a summary (a cliff).
A composition is traced stage by stage. A rewritten message is a stub when the same
ReFold without dedup keeps its content, else a fold; mask and clip say what they did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from gateway import accounting
from gateway.accounting import Ledger, RequestRecord
from gateway.fold.compose import Composed, merge_stats
from gateway.fold.refold import ReFold
from gateway.fold.renderer import Rendered, Renderer, RenderState, estimate_tokens, step_indices
from gateway.pipeline import with_gateway_turns
from gateway.transcript import Message, Opaque, Transcript
from store import NotFound, SessionStore

# What a stage's rewritten and added messages are called in a view (ReFold's: stub, fold).
_REWRITE_KIND = {"mask": "masked", "clip": "clipped"}
_ADDED_KIND = {"cliff": "summary"}

Trace = tuple[Rendered, list[int | None], list[str]]


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
    renderer_for: Callable[[str], Renderer],
    tenant: str,
    session: str,
    request: int,
    branch: int | None = None,
) -> dict[str, Any]:
    """What the model saw at request ``request`` (1-based) of a branch, beside the history.

    Raises ``store.NotFound`` for an unknown session or branch, ``NoSuchRequest`` for a
    request number the branch has not had.
    """
    stored = await store.load(tenant, session, branch)
    ledger = await accounting.read(store, tenant, session, stored.branch_id)
    if not 1 <= request <= len(ledger.log):
        raise NoSuchRequest(
            f"session {session!r} branch {stored.branch_id} has {len(ledger.log)} requests, "
            f"no request {request}"
        )
    messages = [Message.from_dict(m) for m in stored.messages]
    record = ledger.log[request - 1]
    history, restored = with_gateway_turns(messages[: record.messages], stored.gateway_turns)
    state = RenderState(restored=frozenset(restored))
    rendered, sources, kinds = trace(
        renderer_for(record.strategy), Transcript(tuple(history)), state
    )
    previous = None
    if request > 1:
        before = ledger.log[request - 2]
        prev_history, prev_restored = with_gateway_turns(
            messages[: before.messages], stored.gateway_turns
        )
        previous = (
            renderer_for(before.strategy)
            .render(Transcript(tuple(prev_history)), RenderState(restored=frozenset(prev_restored)))
            .transcript.messages
        )
    return _view(
        session,
        stored.branch_id,
        request,
        record,
        history,
        restored,
        rendered,
        sources,
        kinds,
        previous,
        ledger.log[request - 2] if request > 1 else None,
    )


def _view(
    session: str,
    branch: int,
    request: int,
    record: RequestRecord,
    history: list[Message],
    restored: list[int],
    rendered: Rendered,
    sources: list[int | None],
    kinds: list[str],
    previous: Sequence[Message] | None,
    previous_record: RequestRecord | None,
) -> dict[str, Any]:
    state = RenderState(restored=frozenset(restored))
    steps = step_indices(Transcript(tuple(history)), state)
    step_of = {position: n for n, position in enumerate(steps)}
    out_messages = rendered.transcript.messages
    used = {s for s in sources if s is not None}
    stats = rendered.stats
    boundary_at = steps[stats.boundary] if stats.boundary < len(steps) else len(history)
    return {
        "object": "session.render",
        "session": session,
        "branch": branch,
        "request": request,
        "record": asdict(record),
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
            for i, (m, s, k) in enumerate(zip(out_messages, sources, kinds, strict=True))
        ],
        "tokens": {
            "history": sum(estimate_tokens(m) for m in history),
            "rendered": sum(estimate_tokens(m) for m in out_messages),
        },
        "stats": {
            "steps": stats.steps,
            "boundary": stats.boundary,
            "stubs": stats.stubs,
            "folded_steps": stats.folded_steps,
            "compactions": stats.compactions,
            "reminders": stats.reminders,
            "notes": list(stats.notes),
        },
        "chunk_boundary": {
            "step": stats.boundary,
            "rendered_index": next(
                (i for i, s in enumerate(sources) if s is not None and s >= boundary_at),
                len(out_messages),
            ),
        },
        "cached_prefix": _shared_prefix(out_messages, previous, record, previous_record),
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
    messages: Sequence[Message],
    previous: Sequence[Message] | None,
    record: RequestRecord,
    previous_record: RequestRecord | None,
) -> dict[str, Any] | None:
    """How much of this rendering the previous request sent identically: what the replica's
    prefix cache could serve (vLLM caches whole blocks, so a little less in practice)."""
    if previous is None or previous_record is None:
        return None
    same = 0
    while same < min(len(messages), len(previous)) and messages[same] == previous[same]:
        same += 1
    chars = 0
    if same < min(len(messages), len(previous)) and messages[same].role == previous[same].role:
        a, b = messages[same].text, previous[same].text
        while chars < min(len(a), len(b)) and a[chars] == b[chars]:
            chars += 1
    return {
        "messages": same,
        "chars": chars,
        "tokens": sum(estimate_tokens(m) for m in messages[:same]) + chars // 4,
        "same_replica": previous_record.replica == record.replica,
    }


# -- tracing rendered messages back to the history ---------------------------------------


def trace(renderer: Renderer, history: Transcript, state: RenderState | None) -> Trace:
    """The rendering, each rendered message's history index (None: the renderer added it)
    and its kind: verbatim, labelled (content kept, the gateway added a label or a
    reminder), stub, fold, summary, masked, clipped, rewritten, or added."""
    if isinstance(renderer, Composed):
        first, inner_sources, inner_kinds = trace(renderer.inner, history, state)
        second, outer_sources, outer_kinds = trace(renderer.outer, first.transcript, None)
        sources = [None if s is None else inner_sources[s] for s in outer_sources]
        kinds = [
            inner_kinds[s] if s is not None and k in {"verbatim", "labelled"} else k
            for s, k in zip(outer_sources, outer_kinds, strict=True)
        ]
        return Rendered(second.transcript, None, merge_stats(first, second)), sources, kinds
    rendered = renderer.render(history, state)
    out = rendered.transcript.messages
    sources = align(history.messages, out)
    undeduped = None
    if isinstance(renderer, ReFold) and renderer.dedup:
        plain = ReFold(k=renderer.k, dedup=False, fold=renderer.fold)
        undeduped = plain.render(history, state).transcript.messages
    kinds = []
    for i, (m, s) in enumerate(zip(out, sources, strict=True)):
        if s is None:
            kinds.append(_ADDED_KIND.get(renderer.name, "added"))
            continue
        original = history.messages[s]
        if m == original:
            kinds.append("verbatim")
        elif keeps_content(original, m):
            kinds.append("labelled")
        elif isinstance(renderer, ReFold):
            stub = undeduped is not None and keeps_content(original, undeduped[i])
            kinds.append("stub" if stub else "fold")
        else:
            kinds.append(_REWRITE_KIND.get(renderer.name, "rewritten"))
    return rendered, sources, kinds


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
