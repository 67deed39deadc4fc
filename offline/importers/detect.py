"""Which importer reads a file, decided from its content (the extension is only a hint).

A JSON document is classified by its top-level keys; a JSONL file by its first record.
``load_trajectories`` walks folders for ``.json``, ``.jsonl`` and ``.traj`` files (other
files in a log folder, such as READMEs, are not logs); a file named explicitly is always
read, whatever its name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from offline.importers import claude_code, mini_swe_agent, normalized, openhands, swe_agent
from offline.importers.base import Trajectory, TrajectoryFormatError

# Format name -> loader. Names double as the values ``detect_format`` returns.
LOADERS: dict[str, Callable[[Path], list[Trajectory]]] = {
    "normalized": normalized.load,
    "mini-swe-agent": mini_swe_agent.load,
    "swe-agent": swe_agent.load,
    "claude-code": claude_code.load,
    "openhands": openhands.load,
    "openhands-events": openhands.load_events,
}
_LOG_SUFFIXES = {".json", ".jsonl", ".traj"}


def detect_format(path: str | Path) -> str:
    """The format name (a key of ``LOADERS``) of one file; raises if none matches."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFormatError(path, "no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TrajectoryFormatError(path, f"not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise TrajectoryFormatError(path, f"cannot be read: {exc.strerror or exc}") from exc
    if not text.strip():
        raise TrajectoryFormatError(path, "empty file")
    try:
        fmt = _classify_document(json.loads(text))
    except json.JSONDecodeError:
        fmt = None  # not one JSON document: try JSON lines
    if fmt is None:
        fmt = _classify_record(_first_record(path, text))
    if fmt is None:
        raise TrajectoryFormatError(
            path,
            "unrecognised trajectory format (expected normalized JSONL, mini-swe-agent "
            ".traj.json, SWE-agent .traj, Claude Code session JSONL or OpenHands output.jsonl)",
        )
    return fmt


def load_trajectories(
    *paths: str | Path, on_error: Callable[[TrajectoryFormatError], None] | None = None
) -> list[Trajectory]:
    """Every trajectory in the given files and folders (folders searched recursively).

    A file that cannot be read or parsed raises its ``TrajectoryFormatError``; with
    ``on_error`` it is handed to that callback instead and skipped, so one bad log in a
    folder does not stop a run over the rest.
    """
    out: list[Trajectory] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and f.suffix.lower() in _LOG_SUFFIXES and not f.name.startswith(".")
            )
        else:
            files = [p]
        for f in files:
            try:
                out.extend(LOADERS[detect_format(f)](f))
            except TrajectoryFormatError as exc:
                if on_error is None:
                    raise
                on_error(exc)
    return out


def _classify_document(doc: Any) -> str | None:
    if normalized.looks_like(doc):  # the most specific shape: 'format' beside 'messages'
        return "normalized"
    if mini_swe_agent.looks_like(doc):
        return "mini-swe-agent"
    if swe_agent.looks_like(doc):
        return "swe-agent"
    if openhands.looks_like_events(doc):
        return "openhands-events"
    # A one-line JSONL file is also one JSON document: classify it as a record.
    return _classify_record(doc)


def _classify_record(record: Any) -> str | None:
    if normalized.looks_like(record):
        return "normalized"
    if openhands.looks_like_run(record):
        return "openhands"
    if claude_code.looks_like(record):
        return "claude-code"
    return None


def _first_record(path: Path, text: str) -> Any:
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrajectoryFormatError(path, f"malformed JSON line: {exc}", n) from exc
    return None
