"""The neutral transcript model every dialect decodes into and every renderer works on.

A transcript is a tuple of messages with one of four roles. Everything a dialect needs to
write its own JSON back byte-for-byte, but that the pipeline does not interpret, lives in
``meta`` dicts (unknown fields, signatures' neighbours, "was this content a plain string")
and is carried through untouched. Objects are frozen: the history is append-only, and a
renderer builds new messages instead of editing old ones.

``to_dict`` / ``from_dict`` give the plain, msgpack-able form the store keeps and hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Thinking:
    """Model reasoning. ``signature`` (and, for redacted thinking, ``meta``) kept byte-exact."""

    text: str
    signature: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made. ``arguments`` is the JSON text exactly as the model sent it."""

    id: str
    name: str
    arguments: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Opaque:
    """Images, documents and any part type the pipeline does not understand: carried as is."""

    data: Mapping[str, Any]


Part = Text | Thinking | ToolCall | Opaque


@dataclass(frozen=True, slots=True)
class Message:
    """One turn. For ``role == "tool"`` the parts are the result content of ``tool_call_id``."""

    role: Role
    parts: tuple[Part, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {', '.join(ROLES)}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")

    @property
    def text(self) -> str:
        """The message's visible text: its ``Text`` parts joined (thinking excluded)."""
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    @property
    def thinking(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Thinking))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCall))

    def with_text(self, text: str) -> Message:
        """A copy whose ``Text`` parts are replaced by one part holding ``text``.

        Non-text parts (calls, thinking, images) keep their places; the new text takes the
        place of the first text part, or comes first when there was none.
        """
        parts: list[Part] = []
        placed = False
        for p in self.parts:
            if isinstance(p, Text):
                if not placed:
                    parts.append(Text(text, p.meta))
                    placed = True
            else:
                parts.append(p)
        if not placed:
            parts.insert(0, Text(text))
        return replace(self, parts=tuple(parts))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "parts": [_part_to_dict(p) for p in self.parts]}
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.is_error:
            out["is_error"] = True
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        return cls(
            role=data["role"],
            parts=tuple(_part_from_dict(p) for p in data.get("parts", ())),
            tool_call_id=data.get("tool_call_id"),
            is_error=bool(data.get("is_error", False)),
            meta=dict(data.get("meta") or _EMPTY),
        )


@dataclass(frozen=True, slots=True)
class Transcript:
    """A request's conversation plus what travels beside it.

    ``tools`` are the tool schemas as the dialect sent them; ``params`` is every other
    request field (model, max_tokens, stream, unknown ones), passed through untouched.
    """

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    def with_messages(self, messages: Iterable[Message]) -> Transcript:
        return replace(self, messages=tuple(messages))


def tool_name(tool: Mapping[str, Any]) -> object:
    """The name a tool schema declares (OpenAI's nested ``function`` or Anthropic's flat
    shape), as sent: not necessarily a string."""
    function = tool.get("function")
    return function.get("name") if isinstance(function, Mapping) else tool.get("name")


def text_message(role: Role, text: str, **meta: Any) -> Message:
    return Message(role=role, parts=(Text(text),), meta=meta)


def tool_message(call_id: str, text: str, *, is_error: bool = False) -> Message:
    return Message(role="tool", parts=(Text(text),), tool_call_id=call_id, is_error=is_error)


def observation_indices(messages: tuple[Message, ...] | list[Message]) -> list[int]:
    """Indices of the messages that carry tool outputs, in order: step N is the N-th of them.

    Tool-calling harnesses answer calls with ``tool`` messages. Text-action harnesses
    (SWE-agent, mini-swe-agent, OpenHands' text mode) feed observations back as ``user``
    messages: in a transcript with no tool messages, every user message after the first
    assistant reply is an observation.
    """
    tool_idx = [i for i, m in enumerate(messages) if m.role == "tool"]
    if tool_idx:
        return tool_idx
    first_reply = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if first_reply is None:
        return []
    return [i for i, m in enumerate(messages) if i > first_reply and m.role == "user"]


def _part_to_dict(p: Part) -> dict[str, Any]:
    if isinstance(p, Text):
        d: dict[str, Any] = {"type": "text", "text": p.text}
    elif isinstance(p, Thinking):
        d = {"type": "thinking", "text": p.text}
        if p.signature is not None:
            d["signature"] = p.signature
    elif isinstance(p, ToolCall):
        d = {"type": "tool_call", "id": p.id, "name": p.name, "arguments": p.arguments}
    else:
        return {"type": "opaque", "data": dict(p.data)}
    if p.meta:
        d["meta"] = dict(p.meta)
    return d


def _part_from_dict(d: Mapping[str, Any]) -> Part:
    kind = d.get("type")
    meta = dict(d.get("meta") or _EMPTY)
    if kind == "text":
        return Text(d["text"], meta)
    if kind == "thinking":
        return Thinking(d["text"], d.get("signature"), meta)
    if kind == "tool_call":
        return ToolCall(d["id"], d["name"], d["arguments"], meta)
    if kind == "opaque":
        return Opaque(dict(d["data"]))
    raise ValueError(f"unknown part type {kind!r}")
