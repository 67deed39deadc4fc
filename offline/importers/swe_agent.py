"""SWE-agent ``.traj``: ``{"history", "trajectory", "info", ...}``.

``history`` is the message list the model saw. In the default (text-action) form the
command sits in the assistant text and observations come back as ``user`` messages; in the
function-calling form assistants carry ``tool_calls`` and observations are ``tool``
messages naming their call in ``tool_call_ids``. Newer versions may log content as a list
of text parts and Claude thinking as ``thinking_blocks``.

Times: ``trajectory[k].execution_time`` (where logged) is how long step k's action ran; it
becomes the run time of the observation that answers the k-th reply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.transcript import Message, Thinking
from offline.importers.base import MessageTime, Trajectory, read_json, require
from offline.importers.chat import chat_trajectory, decode_chat_messages

HARNESS = "swe-agent"


def looks_like(doc: Any) -> bool:
    return (
        isinstance(doc, Mapping)
        and isinstance(doc.get("history"), list)
        and isinstance(doc.get("trajectory"), list)
    )


def load(path: Path) -> list[Trajectory]:
    doc = read_json(path)
    require(looks_like(doc), path, "not a SWE-agent trajectory (needs 'history', 'trajectory')")
    history = [_with_call_id(h, path, i) for i, h in enumerate(doc["history"])]
    decoded = decode_chat_messages(history, path, where="history")
    messages = tuple(_with_thinking(m, h) for m, h in zip(decoded, history, strict=True))
    info = doc.get("info") if isinstance(doc.get("info"), Mapping) else {}
    meta = {"exit_status": info["exit_status"]} if "exit_status" in info else {}
    return chat_trajectory(HARNESS, path, messages, meta, _times(messages, doc["trajectory"]))


def _times(messages: Sequence[Message], steps: list[Any]) -> list[MessageTime | None]:
    """The action run times on the observations, when the log has one step per reply."""
    runs = [s.get("execution_time") if isinstance(s, Mapping) else None for s in steps]
    replies = [i for i, m in enumerate(messages) if m.role == "assistant"]
    times: list[MessageTime | None] = [None] * len(messages)
    if len(runs) != len(replies):
        return times  # steps and replies do not pair up: no times rather than wrong ones
    for reply, run in zip(replies, runs, strict=True):
        answer = reply + 1
        ok = isinstance(run, int | float) and not isinstance(run, bool)
        if ok and answer < len(messages) and messages[answer].role in ("tool", "user"):
            times[answer] = MessageTime(took_s=float(run))
    return times


def _with_call_id(raw: Any, path: Path, i: int) -> Any:
    """A tool observation with its ``tool_call_ids`` list turned into one ``tool_call_id``."""
    if not isinstance(raw, Mapping) or "tool_call_ids" not in raw:
        return raw
    ids = raw["tool_call_ids"]
    # SWE-agent executes one call per step, so an observation answers exactly one call.
    require(
        isinstance(ids, list) and len(ids) == 1,
        path,
        f"history[{i}]: an observation must answer exactly one call, got {ids!r}",
    )
    return {**raw, "tool_call_id": ids[0]}


def _with_thinking(msg: Message, raw: Mapping[str, Any]) -> Message:
    thinking = [
        Thinking(b.get("thinking", ""), b.get("signature"))
        for b in raw.get("thinking_blocks") or ()
        if isinstance(b, Mapping) and b.get("type") == "thinking"
    ]
    return replace(msg, parts=(*thinking, *msg.parts)) if thinking else msg
