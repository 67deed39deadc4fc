"""Normalized JSONL, mini-swe-agent and SWE-agent: the formats that log chat messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.transcript import Thinking, observation_indices
from offline.importers import TrajectoryFormatError, TrajectoryWarning, load_trajectories
from tests.offline.importers.helpers import write_json, write_jsonl


def call(call_id, command):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'},
    }


def native_messages(steps):
    """An OpenAI-shaped tool-calling run: (thought, command, output) per step."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for i, (thought, command, output) in enumerate(steps):
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": thought,
                "tool_calls": [call(f"c{i}", command)],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
    return msgs


def norm_record(messages, fmt="native_tool_calls", **extra):
    obs = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    return {"id": "run-1", "format": fmt, "messages": messages, "observation_indices": obs, **extra}


def test_normalized_thinking_calls_and_meta(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "n.jsonl",
        [norm_record(native_messages([("why", "ls", "a")]), model="m", compaction_indices=[2])],
    )
    [t] = load_trajectories(path)
    a = t.transcript.messages[2]
    assert isinstance(a.parts[0], Thinking)
    assert (a.thinking, a.text) == ("why", "")
    assert [(c.id, c.name, c.arguments) for c in a.tool_calls] == [
        ("c0", "bash", '{"command": "ls"}')
    ]
    assert (t.id, t.harness, t.fmt, t.compaction_indices) == (
        "run-1",
        "normalized",
        "native_tool_calls",
        (2,),
    )
    assert t.meta == {"id": "run-1", "model": "m"}


def test_normalized_text_actions_find_user_observations(tmp_path: Path) -> None:
    msgs = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "```\nls\n```"},
        {"role": "user", "content": "a.py"},
        {"role": "assistant", "content": "```\nsubmit\n```"},
        {"role": "user", "content": "done"},
    ]
    rec = {
        "format": "text_actions",
        "obs_role": "user",
        "messages": msgs,
        "observation_indices": [2, 4],
    }
    t, _ = load_trajectories(write_jsonl(tmp_path / "n.jsonl", [rec, rec]))
    assert observation_indices(t.transcript.messages) == [2, 4]
    assert t.id == "n_0"  # no id in the record: file stem and line index


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (norm_record([{"role": "user", "content": "x"}], fmt="other"), "format 'other' is not"),
        (norm_record([{"role": "robot", "content": "x"}]), "unknown role 'robot'"),
        (
            norm_record([{"role": "tool", "content": "x"}]),
            r"messages\[0\]\.tool_call_id: missing required field",
        ),
        (
            norm_record([{"role": "tool", "content": "x", "tool_call_id": "c9"}]),
            "'c9' does not answer any earlier assistant tool call",
        ),
        (
            norm_record([{"role": "user", "content": 3}]),
            r"messages\[0\]\.content: content must be a string",
        ),
    ],
)
def test_normalized_errors_name_file_line_and_problem(tmp_path: Path, record, problem) -> None:
    path = write_jsonl(
        tmp_path / "n.jsonl", [norm_record([{"role": "user", "content": "ok"}]), record]
    )
    with pytest.raises(TrajectoryFormatError, match=rf"n\.jsonl:2: .*{problem}"):
        load_trajectories(path)


def mini_doc(messages):
    return {
        "info": {"exit_status": "Submitted"},
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "x-1",
        "messages": messages,
    }


def test_mini_swe_agent_drops_exit_and_keeps_reasoning(tmp_path: Path) -> None:
    msgs = [
        *native_messages([("think", "ls", "out")]),
        {"role": "exit", "content": "patch", "extra": {"exit_status": "Submitted"}},
    ]
    msgs[2]["extra"] = {"actions": []}  # harness bookkeeping fields are ignored
    [t] = load_trajectories(write_json(tmp_path / "x-1.traj.json", mini_doc(msgs)))
    assert [m.role for m in t.transcript.messages] == ["system", "user", "assistant", "tool"]
    assert t.transcript.messages[2].thinking == "think"
    # Harness bookkeeping beside a message is not carried on as pass-through fields.
    assert "extra" not in repr(t.transcript.messages[2].meta)
    assert (t.id, t.fmt, t.meta["exit_status"]) == (
        "mini-swe-agent__x-1",
        "native_tool_calls",
        "Submitted",
    )


def test_mini_swe_agent_text_run_is_text_actions(tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [{"type": "text", "text": "```bash\nls\n```"}]},
        {"role": "user", "content": "<output>a</output>"},
    ]
    [t] = load_trajectories(write_json(tmp_path / "r.traj.json", mini_doc(msgs)))
    assert t.fmt == "text_actions"
    assert t.transcript.messages[2].text == "```bash\nls\n```"
    assert observation_indices(t.transcript.messages) == [3]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=20),
            st.from_regex(r"[a-z ]{1,10}", fullmatch=True),
            st.text(max_size=40),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_mini_swe_agent_and_its_normalized_twin_import_alike(tmp_path_factory, steps) -> None:
    d = tmp_path_factory.mktemp("twin")
    msgs = native_messages(steps)
    [raw] = load_trajectories(write_json(d / "r.traj.json", mini_doc(msgs)))
    [norm] = load_trajectories(write_jsonl(d / "r.jsonl", [norm_record(msgs)]))
    assert raw.transcript.messages == norm.transcript.messages


def swe_doc(history):
    return {
        "environment": "main",
        "trajectory": [],
        "history": history,
        "info": {"exit_status": "submitted"},
    }


def test_swe_agent_default_form_is_text_actions(tmp_path: Path) -> None:
    history = [
        {"role": "system", "content": "sys", "message_type": "system_prompt", "agent": "primary"},
        {"role": "user", "content": "issue", "agent": "primary"},
        {
            "role": "assistant",
            "content": "Look.\n```\nls\n```",
            "thought": "Look.\n",
            "action": "ls\n",
            "agent": "primary",
        },
        {"role": "user", "content": "a.py\n(Open file: n/a)", "agent": "primary"},
    ]
    [t] = load_trajectories(write_json(tmp_path / "demo.traj", swe_doc(history)))
    assert (t.id, t.fmt) == ("swe-agent__demo", "text_actions")
    assert [m.text for m in t.transcript.messages] == [h["content"] for h in history]
    assert observation_indices(t.transcript.messages) == [3]


def test_swe_agent_function_calling_form(tmp_path: Path) -> None:
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "issue"}]},
        {
            "role": "assistant",
            "content": "Look.",
            "thought": "Look.",
            "action": "ls",
            "tool_calls": [call("c1", "ls")],
            "thinking_blocks": [{"type": "thinking", "thinking": "hm", "signature": "s"}],
        },
        {"role": "tool", "content": "a.py", "tool_call_ids": ["c1"]},
    ]
    [t] = load_trajectories(write_json(tmp_path / "fc.traj", swe_doc(history)))
    msgs = t.transcript.messages
    assert t.fmt == "native_tool_calls"
    assert msgs[1].text == "issue"
    assert msgs[2].parts[0] == Thinking("hm", "s")
    assert (msgs[3].role, msgs[3].tool_call_id, msgs[3].text) == ("tool", "c1", "a.py")


def test_swe_agent_observation_for_two_calls_is_rejected(tmp_path: Path) -> None:
    history = [{"role": "tool", "content": "x", "tool_call_ids": ["a", "b"]}]
    with pytest.raises(
        TrajectoryFormatError,
        match=r"bad\.traj: history\[0\]: an observation must answer exactly one call",
    ):
        load_trajectories(write_json(tmp_path / "bad.traj", swe_doc(history)))


def test_normalized_indices_that_disagree_warn_naming_the_file(tmp_path: Path) -> None:
    rec = {**norm_record(native_messages([("", "ls", "a")])), "observation_indices": [1]}
    path = write_jsonl(tmp_path / "stale.jsonl", [rec])
    with pytest.warns(TrajectoryWarning, match=r"stale\.jsonl:1: observation_indices \[1\]"):
        (t,) = load_trajectories(path)
    assert observation_indices(t.transcript.messages) == [3]  # the messages win
