"""Fold operator ``progress``: the harness's own task list says a sub-task is finished.

Agents that keep a task list mark an item in progress, work on it, then mark it done:

- Claude Code ``TodoWrite``: the whole list each call, ``todos: [{content, status}]``,
  status ``pending | in_progress | completed`` (items by ``id`` where given, else by
  their text); Claude Code 2.1.16+ ``TaskCreate {subject}`` (answered "Task #N created")
  and ``TaskUpdate {taskId, status}``.
- Codex ``update_plan``: ``plan: [{step, status}]``, ``pending | in_progress | completed``.
- OpenHands ``task_tracker``: ``task_list: [{id, title, status}]``, ``todo | in_progress
  | done``.

When an item goes done, the steps after the list update that put it in progress (or,
when none did, after the previous list update) up to the update that marks it done are
the finished sub-task: each is claimed with the note ``finished: <the item's text>``. The
list updates themselves are not claimed (they are short, and the latest list is in the
calls anyway). Where sub-tasks nest (an item started while another was in progress), a
step goes with the one started last.

Why it is safe: the agent itself declared the work done, in its own words, and the note
keeps those words; what it still needs later shows up as a reference (quoted lines,
paths it learnt there, ids) and keeps the step (``gateway.fold.references``). Example:
``TodoWrite [{"content": "Run the test suite", "status": "in_progress"}]``, then three
``Bash`` runs of pytest and a fix, then the item ``completed``: the three test logs are
folded to ``finished: Run the test suite``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.fold.operators import FoldClaim, FoldOperator, StepView, register

_ACTIVE = frozenset({"in_progress"})
_DONE = frozenset({"completed", "done"})
_CREATED = re.compile(r"Task #(\w+) created")
PROGRESS_TOOLS = frozenset({"TodoWrite", "TaskCreate", "TaskUpdate", "update_plan", "task_tracker"})


@dataclass(slots=True)
class _Item:
    text: str
    status: str = "pending"
    started: int | None = None  # the list update's step that put it in progress


@dataclass(slots=True)
class ProgressState:
    items: dict[str, _Item] = field(default_factory=dict)
    last_update: int | None = None  # the step of the previous list update
    updates: set[int] = field(default_factory=set)
    created: int = 0  # TaskCreate calls so far (ids count from 1 when a result has none)
    # step -> (start of the sub-task that claimed it): the latest-started one wins
    claimed: dict[int, int] = field(default_factory=dict)


def _arguments(arguments: str) -> dict[str, Any]:
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return args if isinstance(args, dict) else {}


def _listed(name: str, args: dict[str, Any]) -> list[tuple[str, str, str]] | None:
    """(key, text, status) of each item of a whole-list update, None if it is not one."""
    if name == "TodoWrite":
        entries, text_key = args.get("todos"), "content"
    elif name == "update_plan":
        entries, text_key = args.get("plan"), "step"
    elif name == "task_tracker" and args.get("command", "plan") == "plan":
        entries, text_key = args.get("task_list"), "title"
    else:
        return None
    if not isinstance(entries, list):
        return None
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        text, status = entry.get(text_key), entry.get("status")
        if not isinstance(text, str) or not isinstance(status, str) or not text.strip():
            continue
        key = entry.get("id")
        out.append((str(key) if key is not None else text, " ".join(text.split()), status))
    return out


class ProgressTools(FoldOperator):
    name = "progress"

    def start(self) -> ProgressState:
        return ProgressState()

    def observe(self, state: ProgressState, view: StepView) -> list[FoldClaim]:
        call = view.call
        if call is None or call.name not in PROGRESS_TOOLS:
            return []
        args = _arguments(call.arguments)
        changes = self._changes(state, call.name, args, view.text)
        step = view.step
        claims: list[FoldClaim] = []
        for key, text, status in changes:
            item = state.items.setdefault(key, _Item(text))
            item.text = text or item.text
            was, item.status = item.status, status
            if status in _ACTIVE and was not in _ACTIVE:
                item.started = step
            elif status in _DONE and was not in _DONE:
                start = item.started if item.started is not None else state.last_update
                item.started = None
                if start is not None:
                    claims.extend(self._finished(state, start, step, item.text, view.pos))
        state.updates.add(step)
        state.last_update = step
        return claims

    def _changes(
        self, state: ProgressState, name: str, args: dict[str, Any], result: str
    ) -> list[tuple[str, str, str]]:
        listed = _listed(name, args)
        if listed is not None:
            return listed
        if name == "TaskCreate":
            state.created += 1
            subject = args.get("subject")
            found = _CREATED.search(result)
            key = found.group(1) if found else str(state.created)
            return [(key, " ".join(subject.split()), "pending")] if isinstance(subject, str) else []
        if name == "TaskUpdate":
            key, status = args.get("taskId"), args.get("status")
            if key is None or not isinstance(status, str):
                return []
            subject = args.get("subject")
            known = state.items.get(str(key))
            text = subject if isinstance(subject, str) else (known.text if known else "")
            return [(str(key), " ".join(text.split()), status)] if text else []
        return []

    def _finished(
        self, state: ProgressState, start: int, end: int, text: str, pos: int
    ) -> list[FoldClaim]:
        claims = []
        for step in range(start + 1, end):
            if step in state.updates or state.claimed.get(step, -1) > start:
                continue
            state.claimed[step] = start
            claims.append(FoldClaim(step, f"finished: {text}", after=pos))
        return claims


register(ProgressTools())
