"""The Locust replay user against the FAKE upstream, directly and through a real gateway.

Locust runs in a child process (``locust_probe``: Locust's Environment / runner API
in-process there) because importing Locust gevent-patches the interpreter; the gateway and
the fake upstream run here, in the test's event loop, and record what they received.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from tests.gateway.conftest import running_gateway

ROOT = Path(__file__).resolve().parents[2]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def openai_run(tag: str) -> dict[str, Any]:
    """A normalized (OpenAI chat) trajectory: 3 assistant replies, so 3 requests."""
    return {
        "id": f"run-{tag}",
        "format": "native_tool_calls",
        "messages": [
            {"role": "system", "content": f"[{tag}] You are a coding agent."},
            {"role": "user", "content": f"[{tag}] Fix the failing test."},
            {"role": "assistant", "content": "Reading it.",
             "tool_calls": [_call("c1", "read", {"path": "a.py"})]},
            {"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n" * 20},
            {"role": "assistant", "content": "Running the tests.",
             "tool_calls": [_call("c2", "run", {"cmd": "pytest"})]},
            {"role": "tool", "tool_call_id": "c2", "content": "1 failed, 3 passed"},
            {"role": "assistant", "content": "The test expects 2; f returns 1. Fixed."},
        ],
    }  # fmt: skip


def claude_code_session(tag: str) -> list[dict[str, Any]]:
    """A Claude Code session log: user, tool_use, tool_result, final text (2 requests)."""

    def event(kind: str, message: dict[str, Any], n: int) -> dict[str, Any]:
        return {"type": kind, "sessionId": tag, "uuid": f"{tag}-{n}", "message": message}

    return [
        event("user", {"role": "user", "content": f"[{tag}] list the files"}, 0),
        event(
            "assistant",
            {"id": "m1", "role": "assistant", "model": "claude", "content": [
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ]},
            1,
        ),
        event("user", {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.py\nb.py"}]}, 2),
        event("assistant", {"id": "m2", "role": "assistant", "model": "claude",
                            "content": [{"type": "text", "text": "Two files."}]}, 3),
    ]  # fmt: skip


def assistant_prefixes(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant"]


async def run_users(host: str, trajectories: list[Path], users: int, *extra: str) -> dict[str, Any]:
    """Run ``users`` replay users (one session each) against ``host``; Locust's events."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.loadtests.locust_probe",
        "--host", host, "--trajectories", ",".join(map(str, trajectories)),
        "-u", str(users), "--think-time", "0", "--sessions-per-user", "1", *extra,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def canonical(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True)


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["name"] == name]


@pytest.fixture
def openai_file(tmp_path: Path) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(openai_run(t)) + "\n" for t in ("a", "b")))
    return path


@pytest.fixture
def claude_file(tmp_path: Path) -> Path:
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in claude_code_session("cc")))
    return path


async def test_replayed_requests_are_the_trajectory_prefixes(openai_file: Path) -> None:
    # 40 ms between chunks: the first token comes long before the last
    fake = await FakeUpstream(default=ScriptedReply("x" * 48, chunk_delay_s=0.04)).start()
    try:
        result = await run_users(fake.url, [openai_file], 2)
    finally:
        await fake.stop()
    expected = [p for t in ("a", "b") for p in assistant_prefixes(openai_run(t)["messages"])]
    sent = [body["messages"] for body in fake.requests]
    assert sorted(map(canonical, sent)) == sorted(map(canonical, expected))
    for body in fake.requests:
        assert body["stream"] is True and body["ignore_eos"] is True
        assert body["model"] == "tiny" and body["max_tokens"] >= 1
        assert body["stream_options"] == {"include_usage": True}
    events = result["events"]
    posts = named(events, "openai /v1/chat/completions")
    assert len(posts) == len(expected) and all(e["exception"] is None for e in posts)
    # usage events carry what the upstream reported
    reported = Counter(e["response_time"] for e in named(events, "prompt_tokens"))
    assert reported == Counter(map(FakeUpstream.prompt_tokens, fake.requests))
    assert Counter(e["response_time"] for e in named(events, "cached_tokens")) == {0: len(sent)}
    ttft = named(events, "time_to_first_token")
    ttlt = named(events, "time_to_last_token")
    assert len(ttft) == len(ttlt) == len(sent) and all(e["response_time"] > 0 for e in ttft)
    # 6 text chunks + finish + usage: 7 pauses after the first chunk, at least 5 after the
    # first token; the stream is read as it arrives, not when it ends. Per request: a user
    # fires its request's last-token event and then its first-token event, one after the
    # other (comparing the slowest first token of all requests with the quickest end of
    # any, as this did, failed on a loaded CI machine: 298 + 200 > 346 ms).
    pairs = [
        (end["response_time"], first["response_time"])
        for end, first in pairwise(events)
        if end["name"] == "time_to_last_token" and first["name"] == "time_to_first_token"
    ]
    assert len(pairs) == len(sent)
    assert all(last - first > 5 * 40 for last, first in pairs)


async def test_through_gateway_ignore_eos_reaches_the_replica_and_headers_are_events(
    openai_file: Path, claude_file: Path, store_url: str
) -> None:
    fake = await FakeUpstream().start()
    config = GatewayConfig(store_url=store_url, replicas=(fake.url,), strategy="base")
    try:
        async with running_gateway(config) as gw:
            result = await run_users(gw, [openai_file, claude_file], 3)
    finally:
        await fake.stop()
    assert len(fake.requests) == 3 + 3 + 2
    for body in fake.requests:  # passed through both dialect decoders to the upstream
        assert body["ignore_eos"] is True and body["max_tokens"] >= 1
    events = result["events"]
    assert result["stats"]["POST anthropic /v1/messages"] == {"num_requests": 2, "failures": 0}
    assert result["stats"]["POST openai /v1/chat/completions"] == {"num_requests": 6, "failures": 0}
    upstream_prompts = Counter(map(FakeUpstream.prompt_tokens, fake.requests))
    assert Counter(e["response_time"] for e in named(events, "prompt_tokens")) == upstream_prompts
    raw = named(events, "raw_prompt_tokens")
    rendered = named(events, "rendered_prompt_tokens")
    assert len(raw) == len(rendered) == 8 and all(e["response_time"] > 0 for e in raw + rendered)


async def test_user_waits_the_recorded_gap_not_the_fallback(tmp_path: Path) -> None:
    """A Claude Code log with timestamps: the tool ran 0.6 s, so the user waits 0.6 s before
    the next request, not a draw from the 30 s fallback (which would outlast the run)."""
    events = claude_code_session("cc")
    times = ["20:00:00.000", "20:00:02.000", "20:00:02.600", "20:00:05.000"]
    for event, at in zip(events, times, strict=True):
        event["timestamp"] = f"2026-02-11T{at}Z"
    session = tmp_path / "timed.jsonl"
    session.write_text("".join(json.dumps(e) + "\n" for e in events))
    log = tmp_path / "requests.jsonl"
    fake = await FakeUpstream().start()
    try:
        await run_users(fake.url, [session], 1, "--think-time", "30", "--request-log", str(log))
    finally:
        await fake.stop()
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert (first["think_s"], second["think_s"]) == (0.0, pytest.approx(0.6))
    assert 0.55 <= second["start"] - first["end"] < 5


async def test_failures_are_locust_failures_with_status_and_body(
    openai_file: Path, store_url: str
) -> None:
    refusal = ScriptedReply(status=400, error_message="prompt is malformed: kaboom")
    fake = await FakeUpstream(default=refusal).start()
    config = GatewayConfig(store_url=store_url, replicas=(fake.url,), strategy="base")
    try:
        async with running_gateway(config) as gw:
            result = await run_users(gw, [openai_file], 1)
    finally:
        await fake.stop()
    posts = named(result["events"], "openai /v1/chat/completions")
    assert len(posts) == 3
    for e in posts:
        assert e["exception"] is not None
        assert "HTTP 400" in e["exception"] and "kaboom" in e["exception"]
    assert not named(result["events"], "time_to_first_token")
    assert result["stats"]["POST openai /v1/chat/completions"]["failures"] == 3


async def test_distributed_mode_two_workers_split_the_users(
    openai_file: Path, store_url: str, tmp_path: Path
) -> None:
    """``--processes 2``: a master and two worker processes; each worker logs its own
    requests, and the users of the two workers replay different sessions."""
    fake = await FakeUpstream().start()
    config = GatewayConfig(store_url=store_url, replicas=(fake.url,), strategy="base")
    log = tmp_path / "requests.jsonl"
    try:
        async with running_gateway(config) as gw:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
                "--headless", "--processes", "2", "-u", "2", "-r", "2", "-t", "10s",
                "--host", gw, "--trajectories", str(openai_file), "--think-time", "0",
                "--request-log", str(log), "--tokenizer", "estimate",
                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        await fake.stop()
    assert proc.returncode == 0, out.decode()[-3000:]
    assert "2 workers connected" in out.decode(), out.decode()[-3000:]
    users = {}
    for w in (0, 1):
        assert Path(f"{log}.worker{w}").exists(), out.decode()[-4000:]
        lines = Path(f"{log}.worker{w}").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert records and all(r["ok"] for r in records)
        users[w] = {r["session"].rsplit(":", 1)[1].split(".")[0] for r in records}
        first = min(records, key=lambda r: r["start"])
        # user k of worker w is user 2k + w overall; user i starts on trajectory i
        assert first["trajectory"] == ("run-a", "run-b")[w]
    assert users == {0: {"0"}, 1: {"1"}}
