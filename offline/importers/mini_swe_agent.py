"""mini-swe-agent ``.traj.json``: ``{"info", "messages", "trajectory_format"}``.

``messages`` are the chat messages the model saw. Runs with tool calling (v2) answer calls
with ``tool`` messages; older text runs put the bash block in the assistant text and the
output in a ``user`` message. The final ``exit`` message is bookkeeping (the submission
echoed back), never sent to the model, so it is dropped.

Times: recent versions log ``extra.timestamp`` (Unix seconds, when the message was added)
on replies and observations, and the provider's ``extra.response.created`` (whole seconds,
when the reply was created) on replies.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from offline.importers.base import MessageTime, Trajectory, read_json, require
from offline.importers.chat import chat_trajectory, decode_chat_messages

HARNESS = "mini-swe-agent"


def looks_like(doc: Any) -> bool:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("messages"), list):
        return False
    return str(doc.get("trajectory_format", "")).startswith("mini-swe-agent") or "info" in doc


def load(path: Path) -> list[Trajectory]:
    doc = read_json(path)
    require(looks_like(doc), path, "not a mini-swe-agent trajectory (needs 'messages', 'info')")
    sent = [m for m in doc["messages"] if not (isinstance(m, Mapping) and m.get("role") == "exit")]
    messages = decode_chat_messages(sent, path)
    info = doc.get("info") if isinstance(doc.get("info"), Mapping) else {}
    meta = {
        "instance_id": doc.get("instance_id"),
        "trajectory_format": doc.get("trajectory_format"),
        "exit_status": info.get("exit_status"),
    }
    return chat_trajectory(
        HARNESS,
        path,
        messages,
        {k: v for k, v in meta.items() if v is not None},
        [_time(m) for m in sent],
    )


def _time(raw: Any) -> MessageTime | None:
    extra = raw.get("extra") if isinstance(raw, Mapping) else None
    if not isinstance(extra, Mapping) or not _number(extra.get("timestamp")):
        return None
    at = float(extra["timestamp"])
    response = extra.get("response")
    created = response.get("created") if isinstance(response, Mapping) else None
    # ``created`` has whole seconds only: the model time is known to within a second.
    took = max(0.0, at - float(created)) if _number(created) else None
    return MessageTime(at, took)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
