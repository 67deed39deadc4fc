"""An OpenAI-tools agent session driven through a gateway, built so that ReFold has
something to show: step 1 re-reads step 0's file byte for byte (a dedup stub once step 1
is below the chunk boundary) and the reply after step 2 marks it stale (a fold)."""

from __future__ import annotations

import asyncio
import json

import httpx

SESSION = "inspect-me"
STEPS = 7
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _file(name: str, lines: int) -> str:
    return "\n".join(
        f"def {name}_{i}(x):\n    return x * {i} + len('{name}')" for i in range(lines)
    )


# Output i of command i; outputs 0 and 1 are the same file read twice. Step 2 is long: a
# fold of it saves enough to pay for the re-prefill it causes (ReFold prices folds).
COMMANDS = ["cat app.py", "cat app.py", "pytest -x", "cat util.py", "ls", "cat cfg.py", "git diff"]
OUTPUTS = [
    _file("app", 12),
    _file("app", 12),
    "FAILED tests/test_app.py::test_app_3 - AssertionError\n" + _file("trace", 150),
    "def util(x):\n    return x",
    "app.py\nutil.py\ncfg.py\ntests/",
    "DEBUG = False",
    "diff --git a/app.py b/app.py\n-    return x * 3\n+    return x * 4",
]


def reply(i: int) -> str:
    """The agent's reply before step ``i``, with the fold protocol's lines."""
    stale = "2" if i == 3 else "-"
    progress = f"looked at step {i - 1}" if i else "read the task"
    return f"PROGRESS: {progress}\nSTALE: {stale}\nNext I run {COMMANDS[i]}."


def history(upto: int) -> list[dict]:
    """What the harness sends for its request after step ``upto``'s output."""
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in app.py."},
    ]
    for i in range(upto + 1):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": COMMANDS[i]})},
        }
        messages.append({"role": "assistant", "content": reply(i), "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": OUTPUTS[i]})
    return messages


async def drive(client: httpx.AsyncClient, url: str, headers: dict | None = None) -> None:
    """Send the session's ``STEPS`` requests, then wait until all are accounted."""
    headers = {"x-session-id": SESSION, **(headers or {})}
    for upto in range(STEPS):
        body = {"model": "m", "messages": history(upto), "tools": TOOLS, "max_tokens": 8}
        resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
    for _ in range(200):  # accounting runs after the reply
        resp = await client.get(f"{url}/v1/sessions/{SESSION}", headers=headers)
        if resp.status_code == 200 and resp.json()["requests"] == STEPS:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"session never showed {STEPS} requests: {resp.text}")


async def started(client, url: str, sessions: list[str], headers: dict | None = None) -> None:
    """One request in each of ``sessions``, in this order (the last is the most recent)."""
    body = {"model": "m", "messages": history(0), "tools": TOOLS}
    for session in sessions:
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-session-id": session, **(headers or {})},
        )
        assert resp.status_code == 200, resp.text
