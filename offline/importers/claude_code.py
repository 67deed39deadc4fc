"""Claude Code session JSONL (``~/.claude/projects/<project>/<session>.jsonl``).

Each line is an event. Only ``user`` and ``assistant`` events are conversation; progress,
file-history snapshots, queue operations and other ``system`` events are UI bookkeeping and
are dropped, except ``compact_boundary``, which is kept as a compaction index.

Mapping rules (the same ones the normalized twins were made with):
- Claude Code logs one assistant event per content block; events sharing ``message.id`` are
  one model reply and are merged, even when tool results were logged between them (the
  results then follow the merged reply, in order).
- ``tool_result`` blocks in user events become ``tool`` messages; a list result's text
  blocks are joined with newlines. Other user content becomes a ``user`` message.
- Thinking becomes ``Thinking`` parts (signature kept); whitespace-only text blocks, which
  Claude Code logs before streamed thinking, are dropped; ``tool_use.input`` is encoded as
  the JSON argument text.
- Every event carries an ISO ``timestamp``: a reply's time is that of its last event (when
  it had finished), a tool result's or user message's that of its event.
- Meta entries (skill text, command caveats) and the compaction summary were in the model's
  context, so they stay. Sidechain entries inside a main session belong to a subagent and
  are dropped; a subagent's own file (every entry a sidechain) is kept whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.transcript import Message, Opaque, Part, Role, Text, Thinking, ToolCall, Transcript
from offline.importers.base import MessageTime, Trajectory, read_jsonl, require, stem

HARNESS = "claude-code"
_BOOKKEEPING = {"summary", "file-history-snapshot", "queue-operation", "progress"}


def looks_like(record: Any) -> bool:
    if not isinstance(record, Mapping) or not isinstance(record.get("type"), str):
        return False
    if "messages" in record or "history" in record:
        return False
    return "sessionId" in record or "uuid" in record or record["type"] in _BOOKKEEPING


@dataclass
class _Draft:
    """A message under construction: assistant replies grow while events keep arriving."""

    role: Role
    parts: list[Part] = field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False

    def freeze(self) -> Message:
        return Message(self.role, tuple(self.parts), self.tool_call_id, self.is_error)


def load(path: Path) -> list[Trajectory]:
    records = read_jsonl(path)
    require(bool(records), path, "empty Claude Code session")
    for n, rec in records:
        require(isinstance(rec, Mapping), path, "a session event must be a JSON object", n)
    require(looks_like(records[0][1]), path, "not a Claude Code session event", records[0][0])
    turns = [(n, r) for n, r in records if r.get("type") in ("user", "assistant")]
    subagent = bool(turns) and all(r.get("isSidechain") for _, r in turns)
    drafts: list[_Draft] = []
    times: list[MessageTime | None] = []  # one per draft
    compactions: list[int] = []
    reply: _Draft | None = None  # the assistant reply that events with its id extend
    reply_id: str | None = None
    model = None
    for n, rec in records:
        kind = rec.get("type")
        if kind == "system" and rec.get("subtype") == "compact_boundary":
            compactions.append(len(drafts))
            reply = reply_id = None
            continue
        if kind not in ("user", "assistant") or (rec.get("isSidechain") and not subagent):
            continue
        msg = rec.get("message")
        require(isinstance(msg, Mapping), path, f"{kind} event without a 'message' object", n)
        content = msg.get("content")
        at = _timestamp(rec.get("timestamp"))
        if kind == "assistant":
            mid = msg.get("id")
            if reply is None or mid is None or mid != reply_id:
                reply, reply_id = _Draft("assistant"), mid
                drafts.append(reply)
                times.append(None)
            model = model or msg.get("model")
            reply.parts += _assistant_parts(content, path, n)
            if at is not None:
                times[_index(drafts, reply)] = MessageTime(at)
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        require(isinstance(blocks, list), path, "user content must be a string or a list", n)
        results, rest = _split_user(blocks, path, n)
        drafts += results
        times += [None if at is None else MessageTime(at)] * len(results)
        if rest:
            drafts.append(_Draft("user", rest))
            times.append(None if at is None else MessageTime(at))
            # A user turn ends the reply: a later event with the same id is a new message.
            reply = reply_id = None
    meta = {"session_id": records[-1][1].get("sessionId"), "model": model, "subagent": subagent}
    return [
        Trajectory(
            id=f"{HARNESS}__{stem(path)}",
            harness=HARNESS,
            fmt="native_tool_calls",
            transcript=Transcript(tuple(d.freeze() for d in drafts)),
            source_path=path,
            compaction_indices=tuple(compactions),
            meta={k: v for k, v in meta.items() if v is not None},
            times=tuple(times) if any(t is not None for t in times) else (),
        )
    ]


def _timestamp(value: Any) -> float | None:
    """Unix seconds of an ISO timestamp (``2026-02-11T20:36:47.925Z``); None if absent or
    unreadable (times are descriptive: a bad one costs the replay its think time only)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _index(drafts: list[_Draft], draft: _Draft) -> int:
    """Position of ``draft`` itself (drafts compare by value; a reply may equal another)."""
    return next(i for i in range(len(drafts) - 1, -1, -1) if drafts[i] is draft)


def _assistant_parts(content: Any, path: Path, line: int) -> list[Part]:
    if isinstance(content, str):
        return [Text(content)] if content.strip() else []
    require(isinstance(content, list), path, "assistant content must be a string or a list", line)
    parts: list[Part] = []
    for b in content:
        require(isinstance(b, Mapping), path, "assistant content blocks must be objects", line)
        kind = b.get("type")
        if kind == "text":
            if b.get("text", "").strip():
                parts.append(Text(b["text"]))
        elif kind == "thinking":
            parts.append(Thinking(b.get("thinking", ""), b.get("signature")))
        elif kind == "tool_use":
            ok = bool(b.get("id")) and bool(b.get("name"))
            require(ok, path, "tool_use block without an id or a name", line)
            args = json.dumps(b.get("input", {}), ensure_ascii=False)
            parts.append(ToolCall(b["id"], b["name"], args))
        else:
            parts.append(Opaque(dict(b)))
    return parts


def _split_user(blocks: list[Any], path: Path, line: int) -> tuple[list[_Draft], list[Part]]:
    """Tool results (as tool-message drafts) and the remaining user parts of one event."""
    results: list[_Draft] = []
    rest: list[Part] = []
    for b in blocks:
        require(isinstance(b, Mapping), path, "user content blocks must be objects", line)
        kind = b.get("type")
        if kind == "tool_result":
            call_id = b.get("tool_use_id")
            require(bool(call_id), path, "tool_result without a tool_use_id", line)
            parts = _result_parts(b.get("content"), path, line)
            results.append(_Draft("tool", parts, call_id, bool(b.get("is_error"))))
        elif kind == "text":
            if b.get("text"):
                rest.append(Text(b["text"]))
        else:
            rest.append(Opaque(dict(b)))
    return results, rest


def _result_parts(content: Any, path: Path, line: int) -> list[Part]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [Text(content)]
    require(isinstance(content, list), path, "tool_result content must be text or a list", line)
    parts: list[Part] = []
    for b in content:
        require(isinstance(b, Mapping), path, "tool_result blocks must be objects", line)
        if b.get("type") != "text":
            parts.append(Opaque(dict(b)))
        elif parts and isinstance(parts[-1], Text):
            parts[-1] = Text(parts[-1].text + "\n" + b.get("text", ""))
        else:
            parts.append(Text(b.get("text", "")))
    return parts
