"""OpenHands ``output.jsonl`` (one run per line, events in ``history``) and event lists.

OpenHands logs actions and observations, not the messages its CodeAct agent sent, so the
messages are rebuilt the way the agent prompted the model (text actions):
- an agent action becomes an assistant message: its thought, then the command in an
  ``<execute_bash>`` / ``<execute_ipython>`` / ``<execute_browse>`` block;
  ``finish`` and ``think`` are the thought alone;
- an observation becomes a ``user`` message holding its ``content``;
- a ``message`` action is the user's (or, when the event says so, the agent's) text.
Legacy events keep fields at the top level; newer ones nest them in ``args`` / ``extras``
and say who spoke in ``source``. Legacy histories of ``[action, observation]`` pairs are
flattened. State-change and recall events are bookkeeping the model never saw: skipped.

Current OpenHands runs its CodeAct agent with function calling: every action the model
chose (``run``, ``read``, ``edit``, ``think``, ``finish``, ...) carries
``tool_call_metadata`` (``function_name``, ``tool_call_id``, the ``model_response``), and
so does the observation answering it (``read``, ``edit``, ``error``, ...). Those become
what the model saw: one assistant message per model response, with its thought and tool
calls (arguments as the response sent them), and a ``tool`` message per observation.
A trajectory with any such event is ``native_tool_calls``. An action without metadata must
be one of the text actions above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.transcript import Message, Text, ToolCall, Transcript, text_message, tool_message
from offline.importers.base import (
    Trajectory,
    TrajectoryFormatError,
    read_json,
    read_jsonl,
    require,
    stem,
)

HARNESS = "openhands"
_BLOCKS = {
    "run": ("execute_bash", "command"),
    "run_ipython": ("execute_ipython", "code"),
    "browse_interactive": ("execute_browse", "browser_actions"),
}
_THOUGHT_ONLY = {"finish", "think"}
_SKIPPED = {"change_agent_state", "agent_state_changed", "recall", "null", "system"}


def looks_like_run(record: Any) -> bool:
    """One ``output.jsonl`` line: a run record with an event ``history``."""
    return (
        isinstance(record, Mapping)
        and isinstance(record.get("history"), list)
        and any(k in record for k in ("instruction", "instance_id", "issue", "metrics"))
    )


def looks_like_events(doc: Any) -> bool:
    """An exported event list: JSON array of action / observation events."""
    return (
        isinstance(doc, list)
        and bool(doc)
        and all(isinstance(e, Mapping) and ("action" in e or "observation" in e) for e in doc)
    )


def load(path: Path) -> list[Trajectory]:
    out = []
    for n, rec in read_jsonl(path):
        require(looks_like_run(rec), path, "not an OpenHands run record (needs 'history')", n)
        # Ids use the 0-based line index, as the run's "line index" is usually quoted.
        out.append(_trajectory(path, f"{stem(path)}_{n - 1}", rec["history"], n, rec))
    return out


def load_events(path: Path) -> list[Trajectory]:
    doc = read_json(path)
    require(looks_like_events(doc), path, "not an OpenHands event list")
    return [_trajectory(path, stem(path), doc, None, {})]


def _trajectory(
    path: Path, name: str, history: list[Any], line: int | None, rec: Mapping[str, Any]
) -> Trajectory:
    events = [e for item in history for e in (item if isinstance(item, list) else [item])]
    messages: list[Message] = []
    response_of_last: str | None = None  # model response id of the last assistant message
    native = False
    for i, event in enumerate(events):
        call = _tool_call(event, path, line, i)
        if call is not None:
            native = True
            thought, tool_call, response = call
            if response is not None and response == response_of_last and messages:
                # Another call of the same model response: the same assistant turn.
                last = messages[-1]
                messages[-1] = Message("assistant", (*last.parts, tool_call))
            else:
                parts = (Text(thought), tool_call) if thought else (tool_call,)
                messages.append(Message("assistant", parts))
            response_of_last = response
            continue
        msg = _message(event, path, line, i, first=not messages)
        if msg is not None:
            native = native or msg.role == "tool"
            messages.append(msg)
            response_of_last = None
    meta = {k: rec[k] for k in ("instance_id", "issue", "success") if k in rec}
    if line is not None:
        meta["line_index"] = line - 1
    return Trajectory(
        id=f"{HARNESS}__{name}",
        harness=HARNESS,
        fmt="native_tool_calls" if native else "text_actions",
        transcript=Transcript(tuple(messages)),
        source_path=path,
        meta=meta,
    )


def _message(e: Any, path: Path, line: int | None, i: int, first: bool) -> Message | None:
    where = f"event {i}"
    require(isinstance(e, Mapping), path, f"{where}: an event must be an object", line)
    fields = e.get("args") if isinstance(e.get("args"), Mapping) else e
    if "observation" in e:
        if e["observation"] in _SKIPPED:
            return None
        content = _text(e.get("content"), path, line, where)
        call_id = _metadata(e, path, line, where).get("tool_call_id")
        if call_id:
            return tool_message(str(call_id), content, is_error=e["observation"] == "error")
        return text_message("user", content)
    action = e.get("action")
    if action in _SKIPPED:
        return None
    thought = _text(fields.get("thought") or fields.get("final_thought"), path, line, where)
    if action == "message":
        text = _text(fields.get("content") or e.get("message"), path, line, where)
        # Legacy events do not say who spoke; the run opens with the user's task.
        source = e.get("source") or ("user" if first else "agent")
        return text_message("user" if source == "user" else "assistant", text)
    if action in _THOUGHT_ONLY:
        return text_message("assistant", thought)
    if action in _BLOCKS:
        tag, key = _BLOCKS[action]
        require(key in fields, path, f"{where}: {action!r} action without {key!r}", line)
        body = _text(fields[key], path, line, where)
        block = f"<{tag}>\n{body}\n</{tag}>"
        return text_message("assistant", f"{thought}\n{block}" if thought else block)
    raise TrajectoryFormatError(path, f"{where}: unsupported OpenHands action {action!r}", line)


# Fields OpenHands keeps on an action that are not arguments the model gave.
_NOT_ARGUMENTS = {"thought", "final_thought", "impl_source", "security_risk", "confirmation_state"}


def _arguments(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k not in _NOT_ARGUMENTS and k != "action"}


def _metadata(e: Mapping[str, Any], path: Path, line: int | None, where: str) -> Mapping[str, Any]:
    meta = e.get("tool_call_metadata")
    if meta is None:
        return {}
    require(isinstance(meta, Mapping), path, f"{where}: tool_call_metadata must be an object", line)
    return meta


def _tool_call(
    e: Any, path: Path, line: int | None, i: int
) -> tuple[str, ToolCall, str | None] | None:
    """(thought, call, model response id) for an action the model made by function call."""
    where = f"event {i}"
    if not isinstance(e, Mapping) or "action" not in e or e["action"] in _SKIPPED:
        return None
    meta = _metadata(e, path, line, where)
    call_id, name = meta.get("tool_call_id"), meta.get("function_name")
    if not call_id or not name:
        return None
    fields = e.get("args") if isinstance(e.get("args"), Mapping) else e
    thought = _text(fields.get("thought") or fields.get("final_thought"), path, line, where)
    response = meta.get("model_response")
    response = response if isinstance(response, Mapping) else {}
    arguments = _sent_arguments(response, str(call_id))
    if arguments is None:
        arguments = json.dumps(_arguments(fields), ensure_ascii=False)
    rid = response.get("id")
    return thought, ToolCall(str(call_id), str(name), arguments), str(rid) if rid else None


def _sent_arguments(response: Mapping[str, Any], call_id: str) -> str | None:
    """The call's arguments exactly as the model response sent them, when it was logged."""
    for choice in response.get("choices") or ():
        message = choice.get("message") if isinstance(choice, Mapping) else None
        for call in (message or {}).get("tool_calls") or ():
            if isinstance(call, Mapping) and call.get("id") == call_id:
                fn = call.get("function") or {}
                args = fn.get("arguments") if isinstance(fn, Mapping) else None
                return args if isinstance(args, str) else None
    return None


def _text(value: Any, path: Path, line: int | None, where: str) -> str:
    if value is None:
        return ""
    kind = type(value).__name__
    require(isinstance(value, str), path, f"{where}: expected text, got {kind}", line)
    return value
