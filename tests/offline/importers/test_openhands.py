from __future__ import annotations

from pathlib import Path

import pytest

from gateway.transcript import observation_indices
from offline.importers import TrajectoryFormatError, load_trajectories
from tests.offline.importers.helpers import write_json, write_jsonl

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


def fc_action(action: str, args: dict, call_id: str, function: str, response: str, sent: str):
    """A current (function-calling) OpenHands action event, as its output.jsonl logs it."""
    return {
        "id": len(call_id),
        "source": "agent",
        "action": action,
        "args": args,
        "tool_call_metadata": {
            "function_name": function,
            "tool_call_id": call_id,
            "model_response": {
                "id": response,
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "tool_calls": [
                                {"id": call_id, "function": {"name": function, "arguments": sent}}
                            ],
                        }
                    }
                ],
            },
            "total_calls_in_response": 1,
        },
    }


def fc_observation(observation: str, content: str, call_id: str, function: str) -> dict:
    return {
        "source": "agent",
        "observation": observation,
        "content": content,
        "extras": {},
        "tool_call_metadata": {"function_name": function, "tool_call_id": call_id},
    }


def test_current_function_calling_output_loads_as_tool_calls(tmp_path: Path) -> None:
    task = {"source": "user", "action": "message", "args": {"content": "Fix the bug."}}
    read = fc_action(
        "read",
        {"path": "/w/a.py", "thought": "Look at a.py.", "impl_source": "oh_aci"},
        "call_1",
        "str_replace_editor",
        "resp-1",
        '{"command": "view", "path": "/w/a.py"}',
    )
    edit = fc_action(
        "edit",
        {
            "path": "/w/a.py",
            "command": "str_replace",
            "old_str": "x",
            "new_str": "y",
            "thought": "",
        },
        "call_2",
        "str_replace_editor",
        "resp-2",
        '{"command": "str_replace", "path": "/w/a.py", "old_str": "x", "new_str": "y"}',
    )
    # Two calls of one model response: one assistant turn. The second was not logged in
    # the response, so its arguments come from the event.
    run_a = fc_action(
        "run", {"command": "ls", "thought": "Check."}, "call_3", "bash", "resp-3", "{}"
    )
    run_b = fc_action("run", {"command": "pwd", "thought": ""}, "call_4", "bash", "resp-3", "{}")
    run_b["tool_call_metadata"]["model_response"]["choices"][0]["message"]["tool_calls"] = []
    history = [
        task,
        read,
        fc_observation("read", "1\tx = 1", "call_1", "str_replace_editor"),
        edit,
        fc_observation("error", "No replacement was performed.", "call_2", "str_replace_editor"),
        run_a,
        run_b,
        fc_observation("run", "a.py", "call_3", "bash"),
        fc_observation("run", "/w", "call_4", "bash"),
        {"source": "agent", "action": "finish", "args": {"final_thought": "Done."}},
    ]
    (t,) = load_trajectories(write_jsonl(tmp_path / "output.jsonl", [run_record(history)]))
    assert t.fmt == "native_tool_calls"
    msgs = t.transcript.messages
    assert [m.role for m in msgs] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "tool", "assistant"
    ]  # fmt: skip
    assert msgs[1].text == "Look at a.py."
    (call,) = msgs[1].tool_calls
    assert (call.id, call.name, call.arguments) == (
        "call_1",
        "str_replace_editor",
        '{"command": "view", "path": "/w/a.py"}',
    )
    assert msgs[4].is_error and msgs[4].tool_call_id == "call_2"
    assert [c.id for c in msgs[5].tool_calls] == ["call_3", "call_4"]
    assert msgs[5].tool_calls[1].arguments == '{"command": "pwd"}'
    assert msgs[8].text == "Done."
    assert observation_indices(msgs) == [2, 4, 6, 7]
