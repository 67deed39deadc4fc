"""Anthropic's context editing (``context_management``, beta ``context-management-2025-06-27``):
the request field read into edits the gateway applies, and the response field it answers.

A request asks for edits of the context the model sees, in order::

    {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
               {"type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 100000},
                "keep": {"type": "tool_uses", "value": 3},
                "clear_at_least": {"type": "input_tokens", "value": 5000},
                "exclude_tools": ["web_search"], "clear_tool_inputs": false}]}

The defaults are Anthropic's documented ones: ``trigger`` 100,000 input tokens, ``keep``
3 tool uses, no ``clear_at_least``, no excluded tools, inputs kept; thinking ``keep``
1 turn (or ``"all"``). ``clear_tool_inputs`` is a bool or the names of the tools whose
inputs to clear. ``clear_thinking_20251015`` must come first when both are given, as the
API requires. Anything else (an unknown edit type or field, a wrong value) is refused with
the path of the bad field. The answer, ``context_management.applied_edits``, lists the
edits that cleared something: ``cleared_tool_uses`` / ``cleared_thinking_turns`` and
``cleared_input_tokens`` (on the final ``message_delta`` of a stream).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.dialects.errors import DialectError
from gateway.dialects.fields import expect_list, expect_object, expect_str, require

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
EDIT_TYPES = (CLEAR_THINKING, CLEAR_TOOL_USES)
CONTEXT_MANAGEMENT = "context_management"

DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1

_TOOL_USES_FIELDS = frozenset(
    {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}
)
_THINKING_FIELDS = frozenset({"type", "keep"})


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """``clear_tool_uses_20250919``: once the context passes ``trigger`` (``trigger_kind``
    ``input_tokens`` or ``tool_uses``), clear the results of all but the last ``keep``
    tool uses, oldest first, none of ``exclude_tools``; only when that clears at least
    ``clear_at_least`` tokens. ``clear_inputs``: True (every cleared use's input), or the
    names of the tools whose inputs are cleared too."""

    trigger_kind: str = "input_tokens"
    trigger: int = DEFAULT_TRIGGER_TOKENS
    keep: int = DEFAULT_KEEP_TOOL_USES
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False

    type = CLEAR_TOOL_USES

    def clears_input(self, tool: str) -> bool:
        return self.clear_inputs is True or (
            isinstance(self.clear_inputs, frozenset) and tool in self.clear_inputs
        )


@dataclass(frozen=True, slots=True)
class ClearThinking:
    """``clear_thinking_20251015``: keep the thinking of the last ``keep`` assistant turns
    that have some (None: all of them), clear the older."""

    keep: int | None = DEFAULT_KEEP_THINKING_TURNS

    type = CLEAR_THINKING


ContextEdit = ClearToolUses | ClearThinking


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    """What one edit cleared, in Anthropic's ``applied_edits`` shape (``as_json``)."""

    type: str
    cleared: int  # tool uses, or thinking turns
    cleared_input_tokens: int

    def as_json(self) -> dict[str, Any]:
        key = "cleared_tool_uses" if self.type == CLEAR_TOOL_USES else "cleared_thinking_turns"
        return {
            "type": self.type,
            key: self.cleared,
            "cleared_input_tokens": self.cleared_input_tokens,
        }


def context_management_body(applied: tuple[AppliedEdit, ...]) -> dict[str, Any]:
    """The response's ``context_management`` field."""
    return {"applied_edits": [edit.as_json() for edit in applied]}


def parse_context_management(raw: Any, where: str = CONTEXT_MANAGEMENT) -> tuple[ContextEdit, ...]:
    """The edits a request's ``context_management`` asks for; a DialectError naming the bad
    field otherwise."""
    body = expect_object(raw, where)
    unknown = sorted(set(body) - {"edits"})
    if unknown:
        raise DialectError(f"unknown field {unknown[0]!r}", param=f"{where}.{unknown[0]}")
    raw_edits = expect_list(require(body, "edits", where), f"{where}.edits")
    edits: list[ContextEdit] = []
    for j, raw_edit in enumerate(raw_edits):
        path = f"{where}.edits[{j}]"
        edit = expect_object(raw_edit, path)
        kind = expect_str(require(edit, "type", path), f"{path}.type")
        if kind not in EDIT_TYPES:
            raise DialectError(
                f"unknown context edit type {kind!r}; expected one of {', '.join(EDIT_TYPES)}",
                param=f"{path}.type",
            )
        if any(e.type == kind for e in edits):
            raise DialectError(f"context edit {kind!r} is given twice", param=f"{path}.type")
        if kind == CLEAR_THINKING:
            if edits:
                raise DialectError(
                    f"{CLEAR_THINKING} must be listed first in context_management.edits",
                    param=f"{path}.type",
                )
            edits.append(_clear_thinking(edit, path))
        else:
            edits.append(_clear_tool_uses(edit, path))
    return tuple(edits)


def _unknown_fields(edit: Mapping[str, Any], known: frozenset[str], path: str) -> None:
    unknown = sorted(set(edit) - known)
    if unknown:
        raise DialectError(
            f"unknown field {unknown[0]!r} in a {edit['type']} edit", param=f"{path}.{unknown[0]}"
        )


def _count(value: Any, path: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DialectError("must be an integer", param=path)
    if value < minimum:
        raise DialectError(f"must be at least {minimum}", param=path)
    return value


def _threshold(raw: Any, path: str, kinds: tuple[str, ...], minimum: int) -> tuple[str, int]:
    """A ``{type, value}`` threshold of one of ``kinds``."""
    threshold = expect_object(raw, path)
    _unknown_fields({"type": "threshold", **threshold}, frozenset({"type", "value"}), path)
    kind = expect_str(require(threshold, "type", path), f"{path}.type")
    if kind not in kinds:
        raise DialectError(
            f"unknown {path.rsplit('.', 1)[-1]} type {kind!r}; expected {' or '.join(kinds)}",
            param=f"{path}.type",
        )
    return kind, _count(require(threshold, "value", path), f"{path}.value", minimum)


def _clear_tool_uses(edit: Mapping[str, Any], path: str) -> ClearToolUses:
    _unknown_fields(edit, _TOOL_USES_FIELDS, path)
    out = ClearToolUses()
    trigger_kind, trigger = out.trigger_kind, out.trigger
    if edit.get("trigger") is not None:
        trigger_kind, trigger = _threshold(
            edit["trigger"], f"{path}.trigger", ("input_tokens", "tool_uses"), 1
        )
    keep = out.keep
    if edit.get("keep") is not None:
        keep = _threshold(edit["keep"], f"{path}.keep", ("tool_uses",), 0)[1]
    clear_at_least = 0
    if edit.get("clear_at_least") is not None:
        clear_at_least = _threshold(
            edit["clear_at_least"], f"{path}.clear_at_least", ("input_tokens",), 0
        )[1]
    exclude: frozenset[str] = frozenset()
    if edit.get("exclude_tools") is not None:
        names = expect_list(edit["exclude_tools"], f"{path}.exclude_tools")
        exclude = frozenset(
            expect_str(n, f"{path}.exclude_tools[{i}]") for i, n in enumerate(names)
        )
    inputs: bool | frozenset[str] = False
    raw_inputs = edit.get("clear_tool_inputs")
    if isinstance(raw_inputs, bool):
        inputs = raw_inputs
    elif raw_inputs is not None:
        names = expect_list(raw_inputs, f"{path}.clear_tool_inputs")
        inputs = frozenset(
            expect_str(n, f"{path}.clear_tool_inputs[{i}]") for i, n in enumerate(names)
        )
    return ClearToolUses(trigger_kind, trigger, keep, clear_at_least, exclude, inputs)


def _clear_thinking(edit: Mapping[str, Any], path: str) -> ClearThinking:
    _unknown_fields(edit, _THINKING_FIELDS, path)
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking()
    if keep == "all":
        return ClearThinking(None)
    if isinstance(keep, Mapping) and keep.get("type") == "all":
        _unknown_fields({"type": "keep", **keep}, frozenset({"type"}), f"{path}.keep")
        return ClearThinking(None)
    return ClearThinking(_threshold(keep, f"{path}.keep", ("thinking_turns",), 1)[1])
