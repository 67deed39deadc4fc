"""Normalized JSONL: one run per line, OpenAI chat messages plus ``format`` and indices.

The record's own ``observation_indices`` are checked against the transcript's, so a file
whose messages and indices disagree is rejected instead of replayed with the wrong steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.importers.base import FORMATS, Trajectory, read_jsonl, require
from gateway.importers.chat import decode_chat_messages
from gateway.transcript import Transcript, observation_indices

HARNESS = "normalized"
_TRANSCRIPT_KEYS = {"messages", "format", "obs_role", "observation_indices", "compaction_indices"}


def looks_like(record: Any) -> bool:
    return isinstance(record, Mapping) and "messages" in record and "format" in record


def load(path: Path) -> list[Trajectory]:
    return [_record(path, n, rec) for n, rec in read_jsonl(path)]


def _record(path: Path, line: int, rec: Any) -> Trajectory:
    require(looks_like(rec), path, "not a normalized record (needs 'messages' and 'format')", line)
    fmt = rec["format"]
    require(fmt in FORMATS, path, f"format {fmt!r} is not one of {', '.join(FORMATS)}", line)
    messages = decode_chat_messages(rec["messages"], path, line)
    found = observation_indices(messages)
    given = rec.get("observation_indices")
    require(
        given is None or list(given) == found,
        path,
        f"observation_indices {given} do not match the messages' observations {found}",
        line,
    )
    compactions = tuple(rec.get("compaction_indices") or ())
    require(
        all(isinstance(i, int) and 0 <= i <= len(messages) for i in compactions),
        path,
        f"compaction_indices {list(compactions)} out of range for {len(messages)} messages",
        line,
    )
    meta = {k: v for k, v in rec.items() if k not in _TRANSCRIPT_KEYS}
    return Trajectory(
        id=str(rec.get("id") or f"{path.stem}_{line - 1}"),
        harness=HARNESS,
        fmt=fmt,
        transcript=Transcript(messages),
        source_path=path,
        compaction_indices=compactions,
        meta=meta,
    )
