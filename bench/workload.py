"""The benchmarks' synthetic workload: one coding-agent session with tool calls whose
history grows step by step, and the request bodies a harness would send along it.

Tool outputs look like what coding agents read: numbered source lines; request t re-sends
the whole history up to step t.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

Msg = dict[str, Any]

# Tool outputs look like what coding agents read: numbered source lines, test logs, diffs.
WORDS = [
    *("def", "class", "return", "import", "self", "value", "result", "error", "assert"),
    *("config", "request", "session", "token", "message", "render", "store", "replica"),
    *("stream", "chunk", "append", "index", "items", "len", "None", "True"),
]


def source_text(rng: random.Random, size: int) -> str:
    lines: list[str] = []
    used = 0
    while used < size:
        indent = "    " * rng.randint(0, 3)
        line = f"{len(lines) + 1:6d}\t{indent}{' '.join(rng.choices(WORDS, k=rng.randint(3, 12)))}"
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


def synthetic_session(steps: int, total_kb: int, seed: int = 0) -> list[Msg]:
    """System + task, then ``steps`` assistant tool calls each followed by its output."""
    rng = random.Random(seed)
    per_step = max(64, total_kb * 1024 // steps - 120)
    messages: list[Msg] = [
        {"role": "system", "content": f"{uuid.UUID(int=rng.getrandbits(128))} coding agent."},
        {"role": "user", "content": "The tests in tests/test_store.py fail; fix the bug."},
    ]
    for step in range(steps):
        command = rng.choice(["cat -n", "pytest -q", "grep -rn value", "sed -n 1,200p"])
        call_id = f"call_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"cmd": f"{command} src/mod{step % 9}.py"}),
                        },
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": source_text(rng, per_step)}
        )
    return messages


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def request_bodies(messages: list[Msg], steps: int) -> list[bytes]:
    """Request t (1-based) ends with the output of tool step t; encoded once, sent as is."""
    return [
        json.dumps(
            {
                "model": "fake-model",
                "messages": messages[: 2 + 2 * t],
                "tools": TOOLS,
                "stream": True,
                "max_tokens": 64,
            }
        ).encode()
        for t in range(1, steps + 1)
    ]
