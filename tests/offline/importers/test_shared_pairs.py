"""Every raw shared trajectory imports to the same replay input as its normalized twin.

An extra check over the real logs in ``/work/shared/trajectories`` (override with
``FOLDGATE_TRAJECTORIES``); skipped with the reason when that folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.transcript import Message, observation_indices
from offline.importers import Trajectory, load_trajectories

ROOT = Path(os.environ.get("FOLDGATE_TRAJECTORIES", "/work/shared/trajectories"))
# Raw ids whose twin was named differently (OpenHands: the run on line index 1).
TWIN_IDS = {"openhands__resolver_mock_output_1": "openhands__resolver_1"}
# Raw runs the shared set has no twin for (OpenHands line index 0, an 8-event run).
UNPAIRED = {"openhands__resolver_mock_output_0"}

pytestmark = pytest.mark.skipif(
    not (ROOT / "raw").is_dir() or not (ROOT / "norm").is_dir(),
    reason=f"shared trajectories not found at {ROOT} (extra check; unit tests do not need it)",
)


def replay_view(m: Message) -> tuple:
    """Everything of a message that affects rendering and token counts."""
    calls = tuple((c.id, c.name, c.arguments) for c in m.tool_calls)
    return (m.role, m.text, m.thinking, calls, m.tool_call_id)


def first_difference(raw: Trajectory, norm: Trajectory) -> str | None:
    a, b = raw.transcript.messages, norm.transcript.messages
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if replay_view(x) != replay_view(y):
            return f"message {i}: {replay_view(x)!r:.300} != {replay_view(y)!r:.300}"
    if len(a) != len(b):
        return f"{len(a)} messages != {len(b)}"
    if raw.fmt != norm.fmt:
        return f"format {raw.fmt} != {norm.fmt}"
    if raw.compaction_indices != norm.compaction_indices:
        return f"compactions {raw.compaction_indices} != {norm.compaction_indices}"
    if observation_indices(a) != observation_indices(b):
        return "observation indices differ"
    return None


def test_every_raw_file_matches_its_normalized_twin() -> None:
    raws = {t.id: t for t in load_trajectories(ROOT / "raw")}
    norms = {t.id: t for t in load_trajectories(ROOT / "norm")}
    paired = {TWIN_IDS.get(i, i): t for i, t in raws.items() if i not in UNPAIRED}
    assert sorted(paired) == sorted(norms), "raw files and normalized twins do not pair up"
    problems = {i: first_difference(t, norms[i]) for i, t in paired.items()}
    assert {i: p for i, p in problems.items() if p} == {}
    assert len(paired) == 21
