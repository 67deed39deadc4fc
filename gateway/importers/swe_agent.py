"""SWE-agent ``.traj``: ``{"history", "trajectory", "info", ...}``.

``history`` is the message list the model saw. In the default (text-action) form the
command sits in the assistant text and observations come back as ``user`` messages; in the
function-calling form assistants carry ``tool_calls`` and observations are ``tool``
messages naming their call in ``tool_call_ids``. Newer versions may log content as a list
of text parts and Claude thinking as ``thinking_blocks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.importers.base import Trajectory, read_json, require, stem
from gateway.importers.chat import decode_chat_message
from gateway.transcript import Message, Thinking, Transcript

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
    messages = tuple(_message(m, path, i) for i, m in enumerate(doc["history"]))
    native = any(m.role == "tool" for m in messages)
    info = doc.get("info") if isinstance(doc.get("info"), Mapping) else {}
    return [
        Trajectory(
            id=f"{HARNESS}__{stem(path)}",
            harness=HARNESS,
            fmt="native_tool_calls" if native else "text_actions",
            transcript=Transcript(messages),
            source_path=path,
            meta={"exit_status": info["exit_status"]} if "exit_status" in info else {},
        )
    ]


def _message(raw: Any, path: Path, i: int) -> Message:
    where = f"history entry {i}"
    msg = decode_chat_message(raw, path, where, tool_call_id=lambda m: _call_id(m, path, where))
    blocks = raw.get("thinking_blocks") or ()
    thinking = [
        Thinking(b.get("thinking", ""), b.get("signature"))
        for b in blocks
        if isinstance(b, Mapping) and b.get("type") == "thinking"
    ]
    return replace(msg, parts=(*thinking, *msg.parts)) if thinking else msg


def _call_id(raw: Mapping[str, Any], path: Path, where: str) -> str | None:
    ids = raw.get("tool_call_ids") or ([raw["tool_call_id"]] if raw.get("tool_call_id") else [])
    # SWE-agent executes one call per step, so an observation answers exactly one call.
    require(len(ids) <= 1, path, f"{where}: one observation answers several calls {ids}")
    return ids[0] if ids else None
