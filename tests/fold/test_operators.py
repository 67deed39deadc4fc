"""ReFold's fold operators on each harness's own shapes: progress tools (Claude Code's
TodoWrite and TaskCreate/TaskUpdate, Codex's update_plan, OpenHands' task_tracker),
superseded calls, the reference guard, restores that stop a rule, and Codex's
JSON-wrapped outputs. Every fold restores the exact bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.fold.json_output import unwrap
from gateway.fold.operators import STRIKES
from gateway.fold.refold import ReFold
from gateway.fold.renderer import FOLD, STUB, RenderState
from gateway.fold.restore import restore_outputs
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message, tool_message

HOT = RenderState(pressure=1.0)  # a full KV pool: a removed token is worth a prefilled one


def log(tag: str, lines: int = 60) -> str:
    """A long output no other output repeats."""
    return "\n".join(
        f"{tag}: line {i} of its own output, nothing repeated {i * 7}" for i in range(lines)
    )


class Session:
    """A tool-calling history built call by call, in a harness's own shapes."""

    def __init__(self) -> None:
        self.messages: list[Message] = [
            text_message("system", "You are an agent."),
            text_message("user", "Fix the bug."),
        ]
        self.steps: list[int] = []  # history position of each step
        self.restored: set[int] = set()

    def call(self, name: str, args: dict[str, Any], output: str, say: str = "") -> int:
        """One reply with one call and its output; the output's step number."""
        cid = f"call_{len(self.messages):04d}"
        parts: tuple = ((Text(say),) if say else ()) + (ToolCall(cid, name, json.dumps(args)),)
        self.messages.append(Message("assistant", parts))
        self.messages.append(tool_message(cid, output))
        self.steps.append(len(self.messages) - 1)
        return len(self.steps) - 1

    def bash(self, command: str, output: str, say: str = "") -> int:
        return self.call("Bash", {"command": command, "description": "run it"}, output, say)

    def small(self, n: int) -> None:
        for i in range(n):
            self.bash(f"echo small {len(self.steps)} {i}", "ok")

    def restore(self, spec: str) -> None:
        """The model calls the gateway's restore tool; the gateway answers it."""
        history = self.history()
        cid = f"restore_{len(self.messages)}"
        self.messages.append(
            Message("assistant", (ToolCall(cid, "restore", json.dumps({"steps": spec})),))
        )
        first, _, last = spec.partition("-")
        found = restore_outputs(history, self.state(), int(first), int(last or first))
        text = "\n\n".join(f"[restored step {s}]\n{t}" for s, t in found)
        self.messages.append(tool_message(cid, text))
        self.restored.add(len(self.messages) - 1)

    def history(self) -> Transcript:
        tools = ({"type": "function", "function": {"name": "Bash", "parameters": {}}},)
        return Transcript(tuple(self.messages), tools=tools)

    def state(self) -> RenderState:
        return RenderState(restored=frozenset(self.restored), pressure=1.0)


def render(session: Session, renderer: ReFold | None = None):
    renderer = renderer or ReFold(fold="off")
    history = session.history()
    cache, sent, rewrites = None, (), 0
    # As the harness sends it: the history before each reply, then all of it.
    for end in [i for i, m in enumerate(history.messages) if m.role == "assistant"] + [
        len(history.messages)
    ]:
        request = history.with_messages(history.messages[:end])
        state = RenderState(
            restored=frozenset(i for i in session.restored if i < end), pressure=1.0
        )
        rendered = renderer.render(request, state, cache)
        cache = rendered.cache
        messages = rendered.transcript.messages
        # The prefix property: a rendering extends the one before, except at a priced fold.
        extends = messages[: len(sent)] == sent
        assert extends or rendered.stats.rewrites > rewrites, f"request {end} rewrote unpriced"
        sent, rewrites = messages, rendered.stats.rewrites
    cold = renderer.render(history, session.state())
    assert cold.transcript == rendered.transcript, "a cache changes nothing"
    assert cold.stats == rendered.stats
    return rendered


def folded_text(rendered, session: Session, step: int) -> str | None:
    pos = session.steps[step]
    i = rendered.sources.index(pos)
    return rendered.transcript.messages[i].text if rendered.kinds[i] == FOLD else None


def assert_restores_exactly(session: Session, steps: list[int]) -> None:
    history = session.history()
    for step, text in restore_outputs(history, session.state(), min(steps), max(steps)):
        assert text == history.messages[session.steps[step]].text


# -- progress tools ------------------------------------------------------------------------


def todo(*items: tuple[str, str]) -> dict[str, Any]:
    return {
        "todos": [
            {"content": text, "status": status, "activeForm": f"Doing: {text}"}
            for text, status in items
        ]
    }


TODO_OK = (
    "Todos have been modified successfully. Ensure that you continue to use the todo list "
    "to track your progress."
)


def test_claude_code_todowrite_folds_the_steps_of_a_completed_item() -> None:
    s = Session()
    s.call("TodoWrite", todo(("Run the test suite", "in_progress"), ("Fix it", "pending")), TODO_OK)
    work = [s.bash(f"pytest tests/test_{i}.py", log(f"run{i}")) for i in range(3)]
    s.call(
        "TodoWrite", todo(("Run the test suite", "completed"), ("Fix it", "in_progress")), TODO_OK
    )
    s.small(6)
    rendered = render(s)
    for step in work:
        text = folded_text(rendered, s, step)
        assert text is not None, f"step {step} is not folded"
    note = folded_text(rendered, s, work[0])
    assert "finished: Run the test suite" in note  # the harness's own words
    assert "restore 1-3" in note
    assert folded_text(rendered, s, 0) is None  # the list updates stay
    assert dict(rendered.stats.removed)["progress"] > 0
    assert_restores_exactly(s, work)


def test_claude_code_task_create_and_update_fold_a_finished_task() -> None:
    s = Session()
    s.call(
        "TaskCreate",
        {"subject": "Fix the parser", "description": "x"},
        "Task #7 created successfully: Fix the parser",
    )
    s.call("TaskUpdate", {"taskId": "7", "status": "in_progress"}, "Updated task #7 status")
    work = [s.bash(f"grep -rn parse src/{i}", log(f"grep{i}")) for i in range(2)]
    s.call("TaskUpdate", {"taskId": "7", "status": "completed"}, "Updated task #7 status")
    s.small(6)
    rendered = render(s)
    assert all(folded_text(rendered, s, step) for step in work)
    assert "finished: Fix the parser" in folded_text(rendered, s, work[0])
    assert_restores_exactly(s, work)


def codex_output(text: str, code: int = 0) -> str:
    """Codex's function_call_output: one JSON line."""
    return json.dumps({"output": text, "metadata": {"exit_code": code, "duration_seconds": 0.3}})


def test_codex_update_plan_folds_a_completed_step() -> None:
    s = Session()
    plan = [
        {"step": "Reproduce the crash", "status": "in_progress"},
        {"step": "Patch", "status": "pending"},
    ]
    s.call("update_plan", {"explanation": "start", "plan": plan}, "Plan updated")
    cmds = [["bash", "-lc", f"python repro_{i}.py"] for i in range(3)]
    work = [
        s.call("shell", {"command": c}, codex_output(log(f"trace{i}"), 1))
        for i, c in enumerate(cmds)
    ]
    plan = [
        {"step": "Reproduce the crash", "status": "completed"},
        {"step": "Patch", "status": "in_progress"},
    ]
    s.call("update_plan", {"plan": plan}, "Plan updated")
    s.small(6)
    rendered = render(s)
    assert all(folded_text(rendered, s, step) for step in work)
    assert "finished: Reproduce the crash" in folded_text(rendered, s, work[0])
    assert_restores_exactly(s, work)


def test_openhands_task_tracker_folds_a_done_task() -> None:
    s = Session()

    def tracker(status: str) -> dict[str, Any]:
        return {
            "command": "plan",
            "task_list": [{"id": "t1", "title": "Explore the repository", "status": status}],
        }

    s.call("task_tracker", tracker("in_progress"), "Task list updated")
    work = [
        s.call("str_replace_editor", {"command": "view", "path": f"/repo/m{i}.py"}, log(f"view{i}"))
        for i in range(2)
    ]
    s.call("task_tracker", tracker("done"), "Task list updated")
    s.small(6)
    rendered = render(s)
    assert all(folded_text(rendered, s, step) for step in work)
    assert "finished: Explore the repository" in folded_text(rendered, s, work[0])


def test_an_item_completed_without_going_in_progress_takes_the_steps_since_the_last_update() -> (
    None
):
    s = Session()
    s.call("TodoWrite", todo(("Read the config", "pending")), TODO_OK)
    work = s.bash("cat config.toml", log("config"))
    s.call("TodoWrite", todo(("Read the config", "completed")), TODO_OK)
    s.small(6)
    assert "finished: Read the config" in folded_text(render(s), s, work)


# -- superseded calls ----------------------------------------------------------------------


def test_the_same_command_run_again_supersedes_the_earlier_output() -> None:
    s = Session()
    old = s.bash("pytest tests/test_io.py 2>&1 | tail -80", log("FAILED"))
    s.bash("sed -i s/a/b/ io.py", "")
    s.small(2)
    new = s.bash("pytest tests/test_io.py 2>&1 | tail -20", "3 passed in 0.2s")
    s.small(6)
    rendered = render(s)
    note = folded_text(rendered, s, old)
    assert note is not None
    assert f"superseded: `pytest tests/test_io.py 2>&1 | tail -80` ran again at step {new}" in note
    assert folded_text(rendered, s, new) is None  # the fresh output stays
    assert dict(rendered.stats.removed)["superseded"] > 0
    assert_restores_exactly(s, [old])


def test_a_file_read_again_over_the_same_lines_supersedes_the_earlier_read() -> None:
    s = Session()
    part = "\n".join(
        f"{n:6d}→line {n} before the edit, long enough to matter" for n in range(10, 40)
    )
    whole = "\n".join(
        f"{n:6d}→line {n} after the edit, every one of them new" for n in range(1, 80)
    )
    old = s.call("Read", {"file_path": "/repo/app.py", "offset": 10, "limit": 30}, part)
    s.call(
        "Edit",
        {"file_path": "/repo/app.py", "old_string": "a", "new_string": "b"},
        "The file /repo/app.py has been updated successfully.",
    )
    s.small(2)
    s.call("Read", {"file_path": "/repo/app.py"}, whole)
    s.small(6)
    note = folded_text(render(s), s, old)
    assert note is not None and "/repo/app.py read again" in note


def test_a_read_of_other_lines_does_not_supersede() -> None:
    s = Session()
    part = "\n".join(
        f"{n:6d}→line {n} of the file, long enough to matter here" for n in range(10, 40)
    )
    other = "\n".join(
        f"{n:6d}→line {n} somewhere else in the same file, new" for n in range(100, 130)
    )
    old = s.call("Read", {"file_path": "/repo/app.py", "offset": 10, "limit": 30}, part)
    s.small(2)
    s.call("Read", {"file_path": "/repo/app.py", "offset": 100, "limit": 30}, other)
    s.small(6)
    assert folded_text(render(s), s, old) is None


def test_a_step_a_later_message_quotes_is_not_folded() -> None:
    s = Session()
    failing = log("FAILED") + "\nAssertionError: expected 3 rows, the query returned 4"
    old = s.bash("pytest -q", failing)
    s.small(2)
    s.bash("pytest -q", "1 passed")
    # The agent quotes a line only the old output holds: it still uses it.
    s.bash(
        "git diff",
        "diff",
        say="Earlier it said `AssertionError: expected 3 rows, the query returned 4`, now fixed.",
    )
    s.small(6)
    assert folded_text(render(s), s, old) is None


def test_a_path_the_step_printed_and_a_later_call_opens_keeps_the_step() -> None:
    s = Session()
    hits = log("hit") + "\nsrc/deep/module/parser.py:41:def parse(text):"
    old = s.bash("grep -rn 'def parse' src", hits)
    s.small(2)
    s.bash("grep -rn 'def parse' src", "src/deep/module/parser.py:41:def parse(text):")
    s.call("Read", {"file_path": "/work/src/deep/module/parser.py"}, "     1→x")
    s.small(6)
    # The fresh output shows the path too: the path is no reference to the stale one.
    assert folded_text(render(s), s, old) is not None


# -- restores show a rule is wrong for the session -------------------------------------------


def test_restoring_folds_of_a_rule_twice_stops_the_rule() -> None:
    s = Session()
    stale = []
    for round_ in range(STRIKES + 1):
        stale.append(s.bash("make test", log(f"round{round_}")))
        s.small(5)
    s.bash("make test", "ok")
    s.small(6)
    rendered = render(s)
    assert all(folded_text(rendered, s, step) for step in stale)
    assert rendered.stats.undone_folds == 0
    for step in stale[:STRIKES]:
        s.restore(str(step))
    s.small(1)
    rendered = render(s)
    assert rendered.stats.undone_folds == STRIKES
    assert rendered.stats.stopped_rules == ("superseded",)
    # A new claim of the stopped rule is not folded any more.
    later = s.bash("make lint", log("lint"))
    s.small(2)
    s.bash("make lint", "clean")
    s.small(6)
    rendered = render(s)
    assert folded_text(rendered, s, later) is None
    assert folded_text(rendered, s, stale[-1]) is not None  # what was folded stays folded


def test_operators_can_be_turned_off_or_chosen() -> None:
    s = Session()
    old = s.bash("make test", log("a"))
    s.small(2)
    s.bash("make test", "ok")
    s.small(6)
    assert folded_text(render(s, ReFold(fold="off", operators=False)), s, old) is None
    assert folded_text(render(s, ReFold(fold="off", operators=("progress",))), s, old) is None
    assert folded_text(render(s, ReFold(fold="off", operators=("superseded",))), s, old)
    with pytest.raises(ValueError, match="unknown fold operator"):
        ReFold(operators=("nope",))


# -- Codex's JSON-wrapped outputs ------------------------------------------------------------

SOURCE = "\n".join(
    f"def function_{i}(x):\n    return x * {i} + {i * 3}  # a line" for i in range(40)
)


def test_codex_outputs_are_deduplicated_inside_the_json_string() -> None:
    s = Session()
    first = s.call("shell", {"command": ["bash", "-lc", "cat lib.py"]}, codex_output(SOURCE))
    again = s.call(
        "shell",
        {"command": ["bash", "-lc", "cat lib.py | head -200"]},
        codex_output(SOURCE + "\nexit"),
    )
    other = s.call("shell", {"command": ["bash", "-lc", "ls"]}, codex_output("a.py\nb.py"))
    rendered = render(s, ReFold(fold="off", operators=False))
    messages = dict(zip(rendered.sources, rendered.transcript.messages, strict=True))
    kinds = dict(zip(rendered.sources, rendered.kinds, strict=True))
    history = s.history().messages
    assert messages[s.steps[first]].text == history[s.steps[first]].text
    stubbed = messages[s.steps[again]].text
    assert kinds[s.steps[again]] == STUB
    decoded = json.loads(stubbed)  # still one JSON object, the metadata kept
    assert decoded["metadata"] == {"exit_code": 0, "duration_seconds": 0.3}
    assert (
        decoded["output"].startswith("[duplicate of step 0")
        or "same as step 0" in decoded["output"]
    )
    assert len(stubbed) < len(history[s.steps[again]].text) / 3
    assert messages[s.steps[other]].text == history[s.steps[other]].text  # bytes kept
    assert_restores_exactly(s, [first, other])


@pytest.mark.parametrize(
    "text",
    [
        '{"output":"a\\nb","metadata":{"exit_code":0}}',
        '{ "metadata" : {"exit_code": 1} , "output" : "x\\u00e9\\ty" }',
        '{"output": "caf\u00e9 \\"quoted\\""}',
    ],
)
def test_unwrapping_keeps_the_bytes_around_the_output(text: str) -> None:
    wrapped = unwrap(text)
    assert wrapped is not None
    assert wrapped.inner == json.loads(text)["output"]
    assert wrapped.with_inner(wrapped.inner) == text
    changed = wrapped.with_inner("new")
    assert json.loads(changed) == {**json.loads(text), "output": "new"}


@pytest.mark.parametrize(
    "text",
    ["plain text", '{"output": 3}', '{"output": "x"} and more', "[1, 2]", "{", '{"a": [[[['],
)
def test_other_outputs_are_not_unwrapped(text: str) -> None:
    assert unwrap(text) is None
