"""Normalized JSONL: one run per line, OpenAI chat messages plus ``format`` and indices.

The record's own ``observation_indices`` are checked against the transcript's. When they
disagree the messages win (they are what the model saw; the indices are derived data) and
a ``TrajectoryWarning`` names the file and line, so a hand-edited or stale file still loads.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.transcript import Transcript, observation_indices
from offline.importers.base import FORMATS, Trajectory, TrajectoryWarning, read_jsonl, require
from offline.importers.chat import decode_chat_messages

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
    if given is not None and list(given) != found:
        warnings.warn(
            f"{path}:{line}: observation_indices {given} do not match the messages' "
            f"observations {found}; using the messages'",
            TrajectoryWarning,
            stacklevel=2,
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
