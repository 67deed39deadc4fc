from __future__ import annotations

from pathlib import Path

import pytest

from gateway.transcript import Thinking, observation_indices
from offline.importers import TrajectoryFormatError, load_trajectories
from tests.offline.importers.helpers import write_jsonl

SESSION = "s-1"


def user(content, **extra):
    return {
        "type": "user",
        "sessionId": SESSION,
        "uuid": "u",
        "message": {"role": "user", "content": content},
        **extra,
    }


def assistant(mid, *blocks, **extra):
    msg = {"id": mid, "role": "assistant", "model": "claude-x", "content": list(blocks)}
    return {"type": "assistant", "sessionId": SESSION, "uuid": "a", "message": msg, **extra}


def result(call_id, content, **extra):
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


def use(call_id, name, inp):
    return {"type": "tool_use", "id": call_id, "name": name, "input": inp}


def text(t):
    return {"type": "text", "text": t}


def load_one(path: Path):
    [traj] = load_trajectories(path)
    return traj


def test_events_sharing_message_id_merge_and_results_follow_in_order(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"type": "file-history-snapshot", "messageId": "x", "snapshot": {}},
            user("list files"),
            assistant("m1", text("\n\n")),
            assistant("m1", {"type": "thinking", "thinking": "plan", "signature": "sig"}),
            assistant("m1", text("Looking.")),
            assistant("m1", use("t1", "Bash", {"command": "ls"})),
            user([result("t1", "a.py")]),
            {"type": "progress", "sessionId": SESSION, "uuid": "p", "data": {}},
            assistant("m1", use("t2", "Read", {"file_path": "é.py"})),
            user([result("t2", [text("line 1"), text("line 2")], is_error=True)]),
            assistant("m2", text("Done.")),
        ],
    )
    t = load_one(path)
    msgs = t.transcript.messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    reply = msgs[1]
    assert reply.parts[0] == Thinking("plan", "sig")
    assert reply.text == "Looking."  # the whitespace-only block is dropped
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("t1", "Bash", '{"command": "ls"}'),
        ("t2", "Read", '{"file_path": "é.py"}'),
    ]
    assert (msgs[2].tool_call_id, msgs[2].text, msgs[2].is_error) == ("t1", "a.py", False)
    assert (msgs[3].tool_call_id, msgs[3].text, msgs[3].is_error) == ("t2", "line 1\nline 2", True)
    assert observation_indices(msgs) == [2, 3]
    assert (t.id, t.harness, t.fmt) == ("claude-code__s", "claude-code", "native_tool_calls")
    assert t.meta["model"] == "claude-x"


def test_user_text_ends_the_reply_so_a_repeated_id_starts_a_new_message(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [user("hi"), assistant("m1", text("one")), user("more"), assistant("m1", text("two"))],
    )
    assert [m.text for m in load_one(path).transcript.messages] == ["hi", "one", "more", "two"]


def test_compaction_boundary_meta_entries_and_summary(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            user("task"),
            assistant("m1", text("ok")),
            {"type": "system", "subtype": "stop_hook_summary", "sessionId": SESSION, "uuid": "y"},
            {"type": "system", "subtype": "compact_boundary", "sessionId": SESSION, "uuid": "z"},
            user("summary of earlier work", isCompactSummary=True),
            user([text("skill text")], isMeta=True),
            assistant("m2", text("continuing")),
        ],
    )
    t = load_one(path)
    assert [m.text for m in t.transcript.messages] == [
        "task",
        "ok",
        "summary of earlier work",
        "skill text",
        "continuing",
    ]
    assert t.compaction_indices == (2,)


def test_sidechains_dropped_from_a_main_session_but_a_subagent_file_kept(tmp_path: Path) -> None:
    main = write_jsonl(
        tmp_path / "main.jsonl",
        [
            user("task", isSidechain=False),
            assistant("s1", text("subagent reply"), isSidechain=True),
            assistant("m1", text("main reply"), isSidechain=False),
        ],
    )
    sub = write_jsonl(
        tmp_path / "subagents" / "agent-a1.jsonl",
        [
            user("explore", isSidechain=True, agentId="a1"),
            assistant("s1", use("t1", "Glob", {"pattern": "*"}), isSidechain=True),
            user([result("t1", "x")], isSidechain=True),
        ],
    )
    assert [m.text for m in load_one(main).transcript.messages] == ["task", "main reply"]
    sub_t = load_one(sub)
    assert [m.role for m in sub_t.transcript.messages] == ["user", "assistant", "tool"]
    assert sub_t.meta["subagent"] is True


def test_event_without_message_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [user("hi"), {"type": "assistant", "uuid": "a"}])
    with pytest.raises(TrajectoryFormatError, match=r"s\.jsonl:2: assistant event without"):
        load_trajectories(path)


def test_a_line_that_is_not_an_event_object_is_rejected(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [user("hi"), ["not", "an", "event"]])
    with pytest.raises(TrajectoryFormatError, match=r"s\.jsonl:2: a session event must be"):
        load_trajectories(path)


def test_tool_result_without_call_id_is_rejected(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [user([{"type": "tool_result", "content": "x"}])])
    with pytest.raises(TrajectoryFormatError, match="tool_result without a tool_use_id"):
        load_trajectories(path)
