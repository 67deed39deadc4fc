"""Anthropic's context editing, applied by the gateway to the context it renders.

No vLLM backend implements ``context_management``; the gateway does, on the rendering the
request's strategy made (the stored history is never edited). ``clear_tool_uses_20250919``
replaces the results of old tool uses (and, when asked, their inputs) with a short note
naming the step, so the model can get the exact bytes back with the gateway's restore tool
(which the edit offers when the rendering did not already); ``clear_thinking_20251015``
drops the thinking of older assistant turns. The request's edits come parsed and checked
by the dialect (``gateway.dialects.anthropic_context``, where their semantics are
described); each is applied in order to the output of the one before, and reports what it
cleared, counted with the renderer's token count. An edit that would clear nothing, or
less than its ``clear_at_least`` (the restore tool it adds counted against it), is not
applied, as the API does: the rendering is then left as it was.

Pure: the same rendering, history and edits give the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.dialects.anthropic_context import (
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    ContextEdit,
)
from gateway.fold.renderer import RenderState, TokenCount, step_indices
from gateway.fold.restore import restore_tool_name, restore_tool_schema, restore_tool_tokens
from gateway.transcript import Message, Text, Thinking, ToolCall, Transcript

CLEARED_INPUT = "{}"


def cleared_note(step: int, tool: str, restore_tool: str) -> str:
    """The text a cleared tool result is replaced with: what it was and how to get it back."""
    return (
        f"[{tool} result cleared by context editing (step {step}); "
        f'call {restore_tool} with steps "{step}" to see it again]'
    )


@dataclass(frozen=True, slots=True)
class EditedContext:
    """The rendering after the edits, what each applied edit cleared, and the name of the
    restore tool the rendering offers (the strategy's, or the one the edits added)."""

    transcript: Transcript
    applied: tuple[AppliedEdit, ...]
    restore_tool: str | None


def apply_context_edits(
    rendered: Transcript,
    history: Transcript,
    state: RenderState,
    edits: Sequence[ContextEdit],
    count_tokens: TokenCount,
    restore_tool: str | None = None,
) -> EditedContext:
    """``rendered`` (the strategy's rendering of ``history`` under ``state``) with ``edits``
    applied; ``restore_tool``: the restore tool the rendering already offers, if any."""
    applied: list[AppliedEdit] = []
    for edit in edits:
        if isinstance(edit, ClearThinking):
            result = _clear_thinking(rendered, edit, count_tokens)
        else:
            result = _clear_tool_uses(rendered, history, state, edit, count_tokens, restore_tool)
        if result is not None:
            rendered, done, restore_tool = result
            applied.append(done)
    return EditedContext(rendered, tuple(applied), restore_tool)


def _saved(before: Message, after: Message, count_tokens: TokenCount) -> int:
    return count_tokens(before) - count_tokens(after)


def _clear_thinking(
    rendered: Transcript, edit: ClearThinking, count_tokens: TokenCount
) -> tuple[Transcript, AppliedEdit, str | None] | None:
    turns = [
        i
        for i, m in enumerate(rendered.messages)
        if m.role == "assistant" and any(isinstance(p, Thinking) for p in m.parts)
    ]
    if edit.keep is None or len(turns) <= edit.keep:
        return None
    cleared = turns[: len(turns) - edit.keep]
    messages = list(rendered.messages)
    saved = 0
    for i in cleared:
        m = messages[i]
        messages[i] = replace(m, parts=tuple(p for p in m.parts if not isinstance(p, Thinking)))
        saved += _saved(m, messages[i], count_tokens)
    done = AppliedEdit(ClearThinking.type, len(cleared), max(saved, 0))
    return rendered.with_messages(messages), done, None


def _clear_tool_uses(
    rendered: Transcript,
    history: Transcript,
    state: RenderState,
    edit: ClearToolUses,
    count_tokens: TokenCount,
    restore_tool: str | None,
) -> tuple[Transcript, AppliedEdit, str | None] | None:
    # The harness's tool uses: results of history steps (the gateway's own restore turns
    # are not steps, and are never cleared), with the call each answers.
    step_of = {
        history.messages[i].tool_call_id: n for n, i in enumerate(step_indices(history, state))
    }
    calls: dict[str, tuple[int, ToolCall]] = {}
    uses: list[int] = []
    for i, m in enumerate(rendered.messages):
        for call in m.tool_calls:
            calls[call.id] = (i, call)
        if m.role == "tool" and m.tool_call_id in step_of:
            uses.append(i)
    messages = rendered.messages
    if edit.trigger_kind == "tool_uses":
        triggered = len(uses) > edit.trigger
    else:
        triggered = sum(count_tokens(m) for m in messages) > edit.trigger
    if not triggered:
        return None
    old = uses[: max(len(uses) - edit.keep, 0)]
    name = restore_tool or restore_tool_name(rendered.tools)
    out = list(messages)
    cleared = 0
    for i in old:
        result = messages[i]
        call_index, call = calls.get(result.tool_call_id or "", (None, None))
        tool = call.name if call is not None else "tool"
        if tool in edit.exclude_tools:
            continue
        note = cleared_note(step_of[result.tool_call_id], tool, name)
        out[i] = replace(result, parts=(Text(note),))
        cleared += 1
        if call is not None and call_index is not None and edit.clears_input(tool):
            holder = out[call_index]
            out[call_index] = replace(
                holder,
                parts=tuple(
                    replace(p, arguments=CLEARED_INPUT)
                    if isinstance(p, ToolCall) and p.id == call.id
                    else p
                    for p in holder.parts
                ),
            )
    if not cleared:
        return None
    saved = sum(
        _saved(before, after, count_tokens) for before, after in zip(messages, out, strict=True)
    )
    tools = rendered.tools
    if restore_tool is None:
        tools = (*tools, restore_tool_schema(name))
        saved -= restore_tool_tokens(count_tokens, name)
    if saved <= 0 or saved < edit.clear_at_least:
        return None
    edited = replace(rendered, messages=tuple(out), tools=tools)
    return edited, AppliedEdit(ClearToolUses.type, cleared, saved), name
