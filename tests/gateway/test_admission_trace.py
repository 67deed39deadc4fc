"""The admission trace (``admission_trace``): a line per admission event, each with the
replica's state as the decision read it, so a wait can be explained from the file alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.steps.admission_trace import AdmissionTrace, trace_path
from gateway.steps.working_set import WorkingSetGate
from router import ReplicaMetrics, ReplicaPool
from router.cost import get_preset
from router.working_set_admission import WorkingSetAdmission

URL = "http://replica-0:8000"
POOL_TOKENS = 10_000


def test_a_relative_trace_lies_in_foldgates_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FOLDGATE_HOME", str(tmp_path / "home"))
    assert trace_path("admission.jsonl") == tmp_path / "home" / "admission.jsonl"
    assert trace_path(str(tmp_path / "x.jsonl")) == tmp_path / "x.jsonl"


async def test_a_wait_is_traced_with_the_state_that_held_it(tmp_path: Path) -> None:
    pool = ReplicaPool([URL])
    for r in pool.replicas:
        r.healthy = True
        r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
    admission = WorkingSetAdmission(
        get_preset("cpu-tiny"), max_wait_s=60.0, reserve=False, pool_tokens=POOL_TOKENS,
        work_conserving=False,
    )  # fmt: skip
    clock = [100.0]
    path = tmp_path / "trace.jsonl"
    trace = AdmissionTrace(path, admission, clock=lambda: clock[0], wall=lambda: clock[0])
    gate = WorkingSetGate(admission, pool, clock=lambda: clock[0], trace=trace)

    member = await gate.admit("t", "a", URL, 6_000)
    waiter = asyncio.create_task(gate.admit("t", "b", URL, 6_000))  # 12,000 > 9,000: waits
    while not admission.waiting:
        await asyncio.sleep(0)
    clock[0] += 2.5
    gate.finish(member, served=True)  # room: b goes
    ticket = await waiter
    gate.finish(ticket, served=True)
    trace.close()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["event"], x["session"], x.get("verdict")) for x in lines] == [
        ("decide", "t/a", "admitted"),
        ("decide", "t/b", "waiting"),
        ("ended", "t/a", None),
        ("decide", "t/b", "waited"),
        ("ended", "t/b", None),
    ]
    held = lines[1]
    assert held["because"] == "arrived" and held["tokens"] == 6_000
    assert held["room"] == [POOL_TOKENS, 0]
    # What held it: a, the member running there; b itself first in the queue.
    assert held["state"]["members"] == {"t/a": [6_000, 1, 0.0]}
    assert held["state"]["queue"] == [["t/b", 0.0]]
    assert held["retry_in_s"] == pytest.approx(60.0)  # no reservation ends: its deadline
    went = lines[3]
    assert went["because"] == "changed" and went["waited_s"] == pytest.approx(2.5)
    # Decided, before it starts: out of the queue, not yet a member (a's share ended).
    assert went["state"] == {"members": {}, "queue": [], "roaming": []}
    assert lines[4]["served"] is True
