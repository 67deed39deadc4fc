"""What every importer shares: the ``Trajectory`` record, the error type, and file readers.

Importers turn another tool's log into the neutral transcript, so a replay of a raw log and
of its normalized twin sees the same messages. Every error names the file (and line, for
JSONL) so a user pointing foldgate at a folder of logs knows which one to fix.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.transcript import Transcript

Fmt = Literal["native_tool_calls", "text_actions"]
FORMATS: tuple[Fmt, ...] = ("native_tool_calls", "text_actions")


class TrajectoryFormatError(ValueError):
    """A file that is not a recognised trajectory, or one that breaks its format's rules."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = Path(path)
        self.line = line


class TrajectoryWarning(UserWarning):
    """A trajectory loaded, but something in its file is inconsistent (named in the text)."""


@dataclass(frozen=True, slots=True)
class MessageTime:
    """What a log recorded about when one message happened.

    ``at``: Unix seconds when the message was complete (a reply had finished streaming, an
    observation had been logged). ``took_s``: how long producing it took, where the log
    says (a reply's model time, a tool's run time). Either may be unknown.
    """

    at: float | None = None
    took_s: float | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One recorded agent run as the neutral transcript.

    ``fmt`` says how actions and observations travel: ``native_tool_calls`` (tool calls and
    ``tool`` messages) or ``text_actions`` (actions in assistant text, observations as
    ``user`` messages). ``compaction_indices`` are the message indices where the harness
    itself compacted its context (messages before one had left the live context).
    ``meta`` holds descriptive fields of the source (model, task, origin) and is not replayed.
    ``times`` is empty, or one ``MessageTime`` (or None) per message of the transcript, for
    formats that log when things happened.
    """

    id: str
    harness: str
    fmt: Fmt
    transcript: Transcript
    source_path: Path
    compaction_indices: tuple[int, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    times: tuple[MessageTime | None, ...] = ()

    def __post_init__(self) -> None:
        if self.times and len(self.times) != len(self.transcript.messages):
            raise ValueError(
                f"{self.source_path}: {len(self.times)} message times for "
                f"{len(self.transcript.messages)} messages"
            )

    def think_times(self) -> list[float | None]:
        """Per assistant reply, the recorded seconds between the previous reply's end and
        the request that produced this one (tool runs, harness work, a person typing), or
        None where the log cannot tell (always for the first reply).

        In order of preference: the last message logged between the two replies (the
        request went out once it was in the history) minus the previous reply's end; the
        run times of the tools between them, summed; the time between the two replies' ends
        minus the second reply's own model time where known (else the whole gap). Clock
        skew between logged events never makes a gap negative.
        """
        replies = [i for i, m in enumerate(self.transcript.messages) if m.role == "assistant"]
        if not self.times:
            return [None] * len(replies)
        gaps: list[float | None] = [None]
        for prev, cur in itertools.pairwise(replies):
            gaps.append(_gap(self.times[prev], self.times[prev + 1 : cur], self.times[cur]))
        return gaps[: len(replies)]


def _gap(
    prev: MessageTime | None, between: Sequence[MessageTime | None], cur: MessageTime | None
) -> float | None:
    ended = prev.at if prev is not None else None
    logged = [t.at for t in between if t is not None and t.at is not None]
    runs = [t.took_s for t in between if t is not None and t.took_s is not None]
    if ended is not None and logged:
        gap = max(logged) - ended
    elif runs:
        gap = sum(runs)
    elif ended is not None and cur is not None and cur.at is not None:
        gap = cur.at - ended - (cur.took_s or 0.0)
    else:
        return None
    return max(0.0, gap)


def stem(path: Path) -> str:
    """The file name without its trajectory suffixes (``x.traj.json`` -> ``x``)."""
    name = path.name
    for suffix in (".traj.json", ".traj", ".jsonl", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TrajectoryFormatError(path, f"malformed JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise TrajectoryFormatError(path, f"not UTF-8 text: {exc}") from exc


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line; line numbers start at 1."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TrajectoryFormatError(path, f"not UTF-8 text: {exc}") from exc
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise TrajectoryFormatError(path, f"malformed JSON line: {exc}", n) from exc
    return out


def require(cond: bool, path: Path, problem: str, line: int | None = None) -> None:
    if not cond:
        raise TrajectoryFormatError(path, problem, line)
