"""Fold operator ``superseded``: the same call made again makes the earlier output stale.

- A call made again with the same arguments (the same shell command, whitespace aside and
  with any trailing ``| head``/``| tail`` window on its output; the same text action; any
  tool with the same arguments) supersedes the earlier output: the new one says how
  things are now (``mix test 2>&1 | tail -60`` then ``mix test 2>&1 | tail -20``: the same
  test run, shown through another window).
- A file view (Claude Code ``Read``, an editor's ``view``, ``cat``/``sed -n``/``head``/
  ``nl`` of one file) is superseded by a later view of the same file that covers its lines,
  or by a write of the whole file (``Write``, an editor's ``create``: the new content is in
  the call, which stays shown).

Each superseded step is claimed with the note ``superseded: `<the call>` ran again at
step N`` (or ``... <path> was read again / rewritten at step N``). Progress tools and the
gateway's own restore tool are never claimed here.

Why it is safe: the later output is what the agent reads now, and it stays shown; when
nothing changed in between, deduplication has already stubbed the later copy against the
earlier one, which then stays (a stub names it). A comparison the agent makes between the
old and the new output quotes the old one, and a quoted line that only the old output
holds keeps it (``gateway.fold.references``). Example: ``python -m pytest tests/test_io.py``
fails with a 200-line traceback, the agent edits the code and runs the same command, which
passes: the traceback is folded to ``superseded: `python -m pytest tests/test_io.py` ran
again at step 14``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gateway.fold.calls import (
    call_arguments,
    describe_producer,
    normalize_path,
    path_from_command,
    text_action,
    view_from_command,
)
from gateway.fold.dedup import digest
from gateway.fold.operators import FoldClaim, FoldOperator, StepView, register
from gateway.fold.progress import PROGRESS_TOOLS
from gateway.fold.restore import RESTORE_TOOL_NAME
from gateway.transcript import ToolCall

_WHOLE = 1 << 62  # a view to the end of the file
# A trailing ``| head -n 50`` or ``| tail -20`` only picks which lines of the run are shown:
# running the command again with another window is running it again.
_WINDOWS = frozenset({"head", "tail"})
_WINDOW_OPTION = re.compile(r"-n|-n?\d+|\d+")
_WRITES = frozenset({"Write"})
_EDITORS = frozenset({"str_replace_editor", "str_replace_based_edit_tool", "edit_file"})


@dataclass(frozen=True, slots=True)
class _View:
    path: str
    first: int
    last: int


@dataclass(slots=True)
class SupersedeState:
    # the digest of a call's signature -> its latest step (the signature is compared in
    # full before a claim: digests keep the state small, not the match approximate)
    runs: dict[int, int] = field(default_factory=dict)
    views: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # unclaimed
    producers: dict[int, ToolCall | str] = field(default_factory=dict)  # the history's own


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _view_of_call(call: ToolCall) -> tuple[_View | None, str | None]:
    """(the file lines the call shows, the file it rewrites whole)."""
    args, command = call_arguments(call.arguments)
    path = args.get("file_path") or args.get("path")
    path = normalize_path(path) if isinstance(path, str) and path else None
    if call.name == "Read" and path:
        first = max(1, _int(args.get("offset"), 1))
        limit = _int(args.get("limit"), 0)
        return _View(path, first, first + limit - 1 if limit > 0 else _WHOLE), None
    if call.name in _WRITES and path:
        return None, path
    if call.name in _EDITORS and path:
        if args.get("command") == "create":
            return None, path
        if args.get("command") == "view":
            shown = args.get("view_range")
            if (
                isinstance(shown, list)
                and len(shown) == 2
                and all(isinstance(n, int) for n in shown)
            ):
                last = shown[1] if shown[1] > 0 else _WHOLE
                return _View(path, max(1, shown[0]), last), None
            return _View(path, 1, _WHOLE), None
    return _view_of_command(command) if command else None, None


def _view_of_command(command: str) -> _View | None:
    view = view_from_command(command)
    if view is not None:
        last = view.first_line + view.line_count - 1 if view.line_count else _WHOLE
        return _View(view.path, view.first_line, last)
    numbered = path_from_command(command)
    return _View(numbered, 1, _WHOLE) if numbered and "|" not in command else None


def _command_signature(command: str) -> str:
    """A command without a trailing ``| head``/``| tail`` window, blanks collapsed."""
    words = command.split()
    while len(words) >= 2 and (window := _output_window(words)):
        words = words[:-window]
    return " ".join(words)


def _output_window(words: list[str]) -> int:
    """How many of the last ``words`` are one ``| head [-n] [N]``/``| tail ...`` stage."""
    for size in (4, 3, 2):
        stage = words[-size:]
        if len(stage) == size and stage[0] == "|" and stage[1] in _WINDOWS:
            options = stage[2:]
            if all(_WINDOW_OPTION.fullmatch(o) for o in options):
                return size
    return 0


def _run_signature(call: ToolCall | None, action: str | None) -> str | None:
    if call is None:
        return _command_signature(action) if action else None
    args, command = call_arguments(call.arguments)
    if command is not None:
        return f"{call.name}\0{_command_signature(command)}"
    try:
        canonical = json.dumps(args, sort_keys=True)
    except (TypeError, ValueError):
        canonical = call.arguments
    return f"{call.name}\0{canonical}"


def _signature_of(producer: ToolCall | str) -> str | None:
    if isinstance(producer, ToolCall):
        return _run_signature(producer, None)
    return _run_signature(None, text_action(producer))


def _said(state: SupersedeState, step: int) -> str:
    """How a note names the call of ``step``."""
    return describe_producer(state.producers[step]) or "the call"


class Supersession(FoldOperator):
    name = "superseded"

    def start(self) -> SupersedeState:
        return SupersedeState()

    def observe(self, state: SupersedeState, view: StepView) -> list[FoldClaim]:
        call = view.call
        if call is not None and (
            call.name in PROGRESS_TOOLS or call.name.startswith(RESTORE_TOOL_NAME)
        ):
            return []
        action = None if call is not None else text_action(view.action or "")
        if call is None and action is None:
            return []
        step, claims = view.step, []
        state.producers[step] = call if call is not None else view.action  # type: ignore[assignment]
        signature = _run_signature(call, action)
        if signature is not None:
            key = digest(signature)
            earlier = state.runs.get(key)
            if earlier is not None and _signature_of(state.producers[earlier]) == signature:
                note = f"superseded: `{_said(state, earlier)}` ran again at step {step}"
                claims.append(FoldClaim(earlier, note, after=view.pos, fresh=step))
            state.runs[key] = step
        shown, rewritten = (
            _view_of_call(call) if call is not None else (_view_of_command(action or ""), None)
        )
        if rewritten is not None:
            for earlier, _, _ in state.views.pop(rewritten, []):
                note = (
                    f"superseded: `{_said(state, earlier)}`: {rewritten} rewritten at step {step}"
                )
                claims.append(FoldClaim(earlier, note, after=view.pos, fresh=step))
        if shown is not None:
            kept = []
            for earlier, first, last in state.views.get(shown.path, []):
                if shown.first <= first and last <= shown.last:
                    note = (
                        f"superseded: `{_said(state, earlier)}`: {shown.path} read again "
                        f"at step {step}"
                    )
                    claims.append(FoldClaim(earlier, note, after=view.pos, fresh=step))
                else:
                    kept.append((earlier, first, last))
            kept.append((step, shown.first, shown.last))
            state.views[shown.path] = kept
        # A step claimed both as a re-run and as a re-read gets one claim.
        return list({claim.step: claim for claim in claims}.values())


register(Supersession())
