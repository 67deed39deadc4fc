"""A session longer than the replica's context window, through real vLLM-CPU, with no budget
configured: the gateway learns the window from ``/v1/models``, compacts before the replica
would refuse the prompt, and keeps the compacted prefix so vLLM's prefix cache serves the
requests after it.

One replica with a 4,096-token window (cheap: an 8 MiB KV pool holds four such requests; a
larger window only makes every request dearer on one CPU core without testing more).
The session has the proportions of a real one scaled down: a harness prompt of ~8% of the
window, then tool outputs of ~6% of it that repeat nothing, until its history is more than
twice the window.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.cpu.replicas import DEFAULT_BLOCK_SIZE, available_cores, free_ports, start_replicas
from gateway.config import GatewayConfig
from router.metrics import parse_vllm_metrics
from tests.e2e.conftest import SERVED_NAME
from tests.e2e.trajectory_fixture import record_figures
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.e2e

WINDOW = 4_096
STEPS = 40
MAX_TOKENS = 8
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def small_window_replica(tiny_model_dir: Path) -> Iterator[str]:
    """One replica of the tiny model with a small context window."""
    with start_replicas(
        1,
        ports=free_ports(1),
        model_dir=tiny_model_dir,
        served_name=SERVED_NAME,
        kv_cache_bytes="8M",
        max_model_len=WINDOW,
        cores=available_cores()[:1],
    ) as replicas:
        yield replicas.urls[0]


def output(step: int) -> str:
    """A command output of ~200 tokens (over 500 characters) that repeats nothing."""
    rows = [
        f"src/part_{step}/mod_{j}.py: def handle_{j}(request): return check(request, {j})"
        for j in range(10)
    ]
    return "\n".join(rows)


def messages(tag: str, upto: int) -> list[dict[str, Any]]:
    rules = [f"Rule {i}: keep each edit minimal and say why in one line." for i in range(20)]
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "\n".join([f"[{tag}] You are a coding agent.", *rules])},
        {"role": "user", "content": f"[{tag}] The test suite fails; find out why and fix it."},
    ]
    for i in range(upto):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"command": "inspect part {i}"}}'},
        }
        out.append({"role": "assistant", "content": f"Looking at part {i}.", "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output(i)})
    return out


def prefix_cache(url: str) -> tuple[float, float]:
    """(hits, queries) of the replica's prefix cache, in tokens."""
    scraped = parse_vllm_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    assert scraped.prefix_cache_hits is not None and scraped.prefix_cache_queries is not None
    return scraped.prefix_cache_hits, scraped.prefix_cache_queries


def refusals(text: str) -> tuple[float, float]:
    """The gateway's (overflow retries, upstream 400s) so far (process-wide counters)."""
    retries = errors = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "foldgate_overflow_retries_total":
                retries += s.value
            elif s.name == "foldgate_upstream_errors_total" and s.labels.get("kind") == "400":
                errors += s.value
    return retries, errors


@pytest.mark.parametrize("strategy", ["base", "refold"])
async def test_a_session_past_the_window_compacts_once_and_keeps_its_prefix(
    small_window_replica: str, tmp_path: Path, strategy: str
) -> None:
    url = small_window_replica
    tag = f"{strategy}-{uuid.uuid4()}"
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db",
        replicas=(url,),
        strategy=strategy,
        probe_interval_s=0.5,
    )
    steps: list[dict[str, Any]] = []
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=120) as client:
        start = refusals((await client.get(f"{gw}/metrics")).text)
        for upto in range(STEPS):
            before = prefix_cache(url)
            resp = await client.post(
                f"{gw}/v1/chat/completions",
                json={
                    "model": SERVED_NAME,
                    "messages": messages(tag, upto),
                    "tools": TOOLS,
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,
                },
                headers={"x-session-id": tag},
            )
            assert resp.status_code == 200, resp.text
            after = prefix_cache(url)
            retries, errors = refusals((await client.get(f"{gw}/metrics")).text)
            steps.append(
                {
                    "rendered": int(resp.headers["x-foldgate-prompt-tokens-rendered"]),
                    "prompt": resp.json()["usage"]["prompt_tokens"],
                    "hits": after[0] - before[0],
                    "queries": after[1] - before[1],
                    "overflow_retries": retries - start[0],
                    "upstream_400": errors - start[1],
                }
            )
    raw = len(str(messages(tag, STEPS - 1))) // 4
    # Compactions: where the rendered prompt shrank although the history grew.
    compactions = [i for i in range(1, STEPS) if steps[i]["rendered"] < steps[i - 1]["rendered"]]
    assert compactions, steps
    first = compactions[0]
    later = steps[first + 1 :]
    hits = sum(s["hits"] for s in later)
    queries = sum(s["queries"] for s in later)
    figures = {
        "strategy": strategy,
        "window": WINDOW,
        "requests": STEPS,
        "raw_history_estimate_at_end": raw,
        "max_prompt_tokens": max(s["prompt"] for s in steps),
        "compactions_at": compactions,
        "overflow_retries": steps[-1]["overflow_retries"],
        "upstream_400": steps[-1]["upstream_400"],
        "cached_share_after_first_compaction": round(hits / queries, 4),
        "prompt_tokens_after_first_compaction": queries,
        "per_request": [(s["prompt"], round(s["hits"] / s["queries"], 3)) for s in steps],
    }
    record_figures(f"context_guard/{strategy}", figures)
    assert raw > 2 * WINDOW
    assert max(s["prompt"] for s in steps) <= WINDOW - MAX_TOKENS
    # No refusal after the first compaction (nor before it: the guard compacted first).
    assert steps[-1]["overflow_retries"] == 0 and steps[-1]["upstream_400"] == 0, figures
    # The prefix is kept: after the first compaction, a request that is not itself a
    # compaction extends the previous prompt and is served from the cache up to that prompt's
    # last full block (vLLM caches whole blocks only); a compaction keeps the harness's head
    # (system prompt and task, most of the first request) cached, not re-prefilled.
    for i in range(first + 1, STEPS):
        if i in compactions:
            assert steps[i]["hits"] >= steps[0]["prompt"] // 2, (i, figures)
        else:
            assert steps[i]["hits"] >= steps[i - 1]["prompt"] - DEFAULT_BLOCK_SIZE, (i, figures)
