from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline.importers import TrajectoryFormatError, detect_format, load_trajectories
from tests.offline.importers.helpers import write_json, write_jsonl

NORM = {"id": "n1", "format": "text_actions", "messages": [{"role": "user", "content": "hi"}]}
MINI = {
    "info": {},
    "trajectory_format": "mini-swe-agent-1.1",
    "messages": [{"role": "user", "content": "hi"}],
}
SWE = {"trajectory": [], "history": [{"role": "user", "content": "hi"}], "info": {}}
CLAUDE = {
    "type": "user",
    "sessionId": "s",
    "uuid": "u",
    "message": {"role": "user", "content": "hi"},
}
OPENHANDS = {"instruction": "x", "history": [{"action": "message", "content": "hi"}]}
EVENTS = [{"action": "message", "source": "user", "args": {"content": "hi"}}]


@pytest.mark.parametrize(
    ("name", "doc", "jsonl", "expected"),
    [
        ("a.jsonl", NORM, True, "normalized"),
        ("b.json", NORM, False, "normalized"),
        ("c.traj.json", MINI, False, "mini-swe-agent"),
        ("d.jsonl", MINI, False, "mini-swe-agent"),  # content wins over a wrong suffix
        ("e.traj", SWE, False, "swe-agent"),
        ("f.txt", SWE, False, "swe-agent"),
        ("g.jsonl", CLAUDE, True, "claude-code"),
        ("h.jsonl", OPENHANDS, True, "openhands"),
        ("i.json", EVENTS, False, "openhands-events"),
    ],
)
def test_detects_format_from_content(tmp_path: Path, name, doc, jsonl, expected) -> None:
    path = tmp_path / name
    if jsonl:
        write_jsonl(path, [doc, doc])
    else:
        write_json(path, doc)
    assert detect_format(path) == expected
    assert load_trajectories(path)  # and the detected loader reads it


def test_unrecognised_and_malformed_files_are_named(tmp_path: Path) -> None:
    other = write_json(tmp_path / "other.json", {"hello": "world"})
    with pytest.raises(TrajectoryFormatError, match=r"other\.json: unrecognised trajectory"):
        detect_format(other)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(CLAUDE) + "\n{not json\n", encoding="utf-8")
    assert detect_format(broken) == "claude-code"  # the first record decides
    with pytest.raises(TrajectoryFormatError, match=r"broken\.jsonl:2: malformed JSON line"):
        load_trajectories(broken)
    bad_first = tmp_path / "bad.jsonl"
    bad_first.write_text("{oops\n", encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=r"bad\.jsonl:1: malformed JSON line"):
        detect_format(bad_first)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=r"empty\.jsonl: empty file"):
        detect_format(empty)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrajectoryFormatError, match=r"bin\.json: not UTF-8"):
        detect_format(binary)
    with pytest.raises(TrajectoryFormatError, match=r"missing\.json: no such file"):
        load_trajectories(tmp_path / "missing.json")


def test_folders_are_searched_recursively_for_log_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "runs" / "n.jsonl", [NORM])
    write_json(tmp_path / "runs" / "deep" / "x.traj", SWE)
    write_jsonl(tmp_path / "cc" / "s.jsonl", [CLAUDE])
    (tmp_path / "runs" / "README.md").write_text("not a log", encoding="utf-8")
    (tmp_path / "runs" / ".hidden.json").write_text("{}", encoding="utf-8")
    ids = [t.id for t in load_trajectories(tmp_path / "runs", tmp_path / "cc" / "s.jsonl")]
    assert ids == ["swe-agent__x", "n1", "claude-code__s"]


def test_a_bad_file_is_reported_and_skipped_when_asked(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "logs" / "good.jsonl", [NORM])
    (tmp_path / "logs" / "broken.jsonl").write_text("{not json\n")
    (tmp_path / "logs" / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrajectoryFormatError, match=r"binary\.json"):
        load_trajectories(tmp_path / "logs")  # the default: fail on the first bad file
    seen: list[TrajectoryFormatError] = []
    loaded = load_trajectories(tmp_path / "logs", on_error=seen.append)
    assert [t.id for t in loaded] == ["n1"]
    assert sorted(e.path.name for e in seen) == ["binary.json", "broken.jsonl"]


def test_an_unreadable_file_is_a_format_error_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "dir.jsonl"  # named like a log, but not a file
    folder.mkdir()
    with pytest.raises(TrajectoryFormatError, match=r"dir\.jsonl: no such file"):
        detect_format(folder)
