"""Recorded message times and the think times they give (the gap a replay waits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.transcript import Message, Text, Transcript
from offline.importers import MessageTime, Trajectory, load_trajectories
from tests.offline.importers.helpers import write_json, write_jsonl
from tests.offline.importers.test_chat_formats import call, mini_doc, swe_doc
from tests.offline.importers.test_claude_code import assistant, result, text, use, user


def trajectory(roles: str, times: tuple[MessageTime | None, ...]) -> Trajectory:
    """A text-action run whose messages have the roles of ``roles`` (s, u, a) and ``times``."""
    names = {"s": "system", "u": "user", "a": "assistant"}
    messages = tuple(Message(names[r], (Text(f"m{i}"),)) for i, r in enumerate(roles))  # type: ignore[arg-type]
    return Trajectory("x", "test", "text_actions", Transcript(messages), Path("x"), times=times)


def test_gap_is_last_logged_message_minus_previous_reply_end() -> None:
    t = trajectory(
        "suauua",
        (None, MessageTime(100.0), MessageTime(103.0, took_s=3.0), MessageTime(103.5),
         MessageTime(104.25), MessageTime(110.0)),
    )  # fmt: skip
    # reply 2: its request went out when the second observation was logged, 1.25 s after
    assert t.think_times() == [None, 1.25]


def test_gap_falls_back_to_tool_run_times_then_to_reply_ends_minus_model_time() -> None:
    runs = trajectory("uauaua", (None, None, MessageTime(took_s=0.5), None, None, None))
    assert runs.think_times() == [None, 0.5, None]  # the second gap is not logged at all
    ends = trajectory(
        "uauaua",
        (None, MessageTime(10.0), None, MessageTime(14.0, took_s=1.5), None, MessageTime(20.0)),
    )
    # 14 - 10 - 1.5 (the reply's own model time); 20 - 14 (model time unknown: whole gap)
    assert ends.think_times() == [None, 2.5, 6.0]


def test_clock_skew_never_gives_a_negative_gap_and_no_times_gives_none() -> None:
    skewed = trajectory("uaua", (None, MessageTime(10.0), MessageTime(9.0), None))
    assert skewed.think_times() == [None, 0.0]
    assert trajectory("uaua", ()).think_times() == [None, None]
    with pytest.raises(ValueError, match="2 message times for 4 messages"):
        trajectory("uaua", (None, None))


def test_mini_swe_agent_keeps_timestamps_and_model_time(tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "a", "tool_calls": [call("c1", "ls")],
         "extra": {"timestamp": 1000.5, "response": {"created": 998}}},
        {"role": "tool", "tool_call_id": "c1", "content": "out", "extra": {"timestamp": 1002.0}},
        {"role": "assistant", "content": "b", "tool_calls": [call("c2", "cat")],
         "extra": {"timestamp": 1010.0, "response": {"created": 1007}}},
        {"role": "tool", "tool_call_id": "c2", "content": "out2",
         "extra": {"timestamp": 1010.25}},
        {"role": "assistant", "content": "done", "extra": {"timestamp": 1013.0}},
    ]  # fmt: skip
    [t] = load_trajectories(write_json(tmp_path / "x.traj.json", mini_doc(msgs)))
    assert t.times[:3] == (None, None, MessageTime(1000.5, took_s=2.5))
    assert t.think_times() == [None, 1.5, 0.25]
    untimed = [{k: v for k, v in m.items() if k != "extra"} for m in msgs]
    [plain] = load_trajectories(write_json(tmp_path / "y.traj.json", mini_doc(untimed)))
    assert plain.times == () and plain.think_times() == [None, None, None]


def test_claude_code_reply_time_is_its_last_event_and_results_their_own(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            user("list files", timestamp="2026-02-11T20:00:00.000Z"),
            assistant("m1", text("Looking."), timestamp="2026-02-11T20:00:02.000Z"),
            assistant("m1", use("t1", "Bash", {"command": "ls"}),
                      timestamp="2026-02-11T20:00:03.500Z"),
            user([result("t1", "a.py")], timestamp="2026-02-11T20:00:04.250Z"),
            assistant("m2", text("Two files."), timestamp="2026-02-11T20:00:09.000Z"),
            user("thanks, now b", timestamp="2026-02-11T20:01:09.000Z"),
            assistant("m3", text("Ok."), timestamp="2026-02-11T20:01:10.000Z"),
        ],
    )  # fmt: skip
    [t] = load_trajectories(path)
    assert [m.role for m in t.transcript.messages] == [
        "user", "assistant", "tool", "assistant", "user", "assistant"
    ]  # fmt: skip
    # the merged reply ended with its last event; the tool ran 0.75 s; the person took 60 s
    assert t.think_times() == [None, pytest.approx(0.75), pytest.approx(60.0)]


def test_swe_agent_execution_time_is_the_observation_run_time(tmp_path: Path) -> None:
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "issue"},
        {"role": "assistant", "content": "a", "tool_calls": [call("c1", "ls")]},
        {"role": "tool", "content": "x", "tool_call_ids": ["c1"]},
        {"role": "assistant", "content": "b", "tool_calls": [call("c2", "cat")]},
        {"role": "tool", "content": "y", "tool_call_ids": ["c2"]},
        {"role": "assistant", "content": "done"},
    ]
    doc = swe_doc(history)
    doc["trajectory"] = [{"execution_time": 0.4}, {"execution_time": 1.5}, {}]
    [t] = load_trajectories(write_json(tmp_path / "fc.traj", doc))
    assert t.think_times() == [None, 0.4, 1.5]
    doc["trajectory"] = [{"execution_time": 0.4}]  # steps and replies do not pair up
    [t] = load_trajectories(write_json(tmp_path / "odd.traj", doc))
    assert t.times == () and t.think_times() == [None, None, None]
