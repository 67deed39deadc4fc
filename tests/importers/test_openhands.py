from __future__ import annotations

from pathlib import Path

import pytest

from gateway.importers import TrajectoryFormatError, load_trajectories
from gateway.transcript import observation_indices
from tests.importers.helpers import write_json, write_jsonl

TASK = {
    "content": "Fix the bug.",
    "images_urls": None,
    "wait_for_response": False,
    "action": "message",
}
RUN = {"command": "ls", "thought": "Look first.", "action": "run", "keep_prompt": True}
RUN_OBS = {
    "content": "a.py\r\n$ ",
    "command_id": -1,
    "command": "ls",
    "exit_code": 0,
    "observation": "run",
}
PY = {"code": "print(1)", "thought": "", "action": "run_ipython", "kernel_init_code": "x"}
PY_OBS = {"content": "1", "code": "print(1)", "observation": "run_ipython"}
FINISH = {"outputs": {}, "thought": "All done.", "action": "finish"}


def run_record(history):
    return {
        "instruction": "Fix the bug.",
        "issue": {"number": 1},
        "history": history,
        "metrics": {},
        "success": True,
    }


def test_each_line_is_a_run_and_actions_become_text(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "output.jsonl",
        [run_record([TASK, RUN, RUN_OBS, FINISH]), run_record([TASK, PY, PY_OBS, FINISH])],
    )
    first, second = load_trajectories(path)
    assert (first.id, second.id) == ("openhands__output_0", "openhands__output_1")
    assert first.fmt == "text_actions"
    assert [(m.role, m.text) for m in first.transcript.messages] == [
        ("user", "Fix the bug."),
        ("assistant", "Look first.\n<execute_bash>\nls\n</execute_bash>"),
        ("user", "a.py\r\n$ "),
        ("assistant", "All done."),
    ]
    # An empty thought leaves just the block.
    assert second.transcript.messages[1].text == "<execute_ipython>\nprint(1)\n</execute_ipython>"
    assert observation_indices(first.transcript.messages) == [2]
    assert second.meta["line_index"] == 1


def test_legacy_action_observation_pairs_are_flattened(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "out.jsonl",
        [run_record([[TASK, {"observation": "null", "content": ""}], [RUN, RUN_OBS]])],
    )
    [t] = load_trajectories(path)
    assert [m.role for m in t.transcript.messages] == ["user", "assistant", "user"]


def test_event_list_with_args_and_source(tmp_path: Path) -> None:
    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "Hi"}},
        {"id": 1, "source": "agent", "action": "change_agent_state", "args": {}},
        {"id": 2, "source": "agent", "action": "run", "args": {"command": "ls", "thought": "t"}},
        {"id": 3, "source": "agent", "observation": "run", "content": "x", "extras": {}},
        {"id": 4, "source": "agent", "action": "message", "args": {"content": "Done"}},
    ]
    [t] = load_trajectories(write_json(tmp_path / "events.json", events))
    assert [(m.role, m.text) for m in t.transcript.messages] == [
        ("user", "Hi"),
        ("assistant", "t\n<execute_bash>\nls\n</execute_bash>"),
        ("user", "x"),
        ("assistant", "Done"),
    ]


def test_unknown_action_and_missing_command_are_named(tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "o.jsonl", [run_record([TASK, {"action": "teleport"}])])
    with pytest.raises(TrajectoryFormatError, match=r"o\.jsonl:1: event 1: .*'teleport'"):
        load_trajectories(bad)
    missing = write_jsonl(tmp_path / "p.jsonl", [run_record([TASK, {"action": "run"}])])
    with pytest.raises(TrajectoryFormatError, match="'run' action without 'command'"):
        load_trajectories(missing)


def test_a_line_that_is_not_a_run_is_rejected(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "o.jsonl", [run_record([TASK]), {"history": "nope"}])
    with pytest.raises(TrajectoryFormatError, match=r"o\.jsonl:2: not an OpenHands run"):
        load_trajectories(path)
