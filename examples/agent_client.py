"""Drive the gateway the way an agent harness does, with the unmodified OpenAI SDK.

Replays a recorded session step by step: request t re-sends every message before the t-th
assistant reply, as harnesses do. Prints, per step, the prompt size before and after the
gateway rendered it, and what the vLLM replica reported (prompt tokens, prefix-cached).

    python examples/agent_client.py --base-url http://127.0.0.1:8080/v1 [SESSION.jsonl]
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

from openai import OpenAI

HERE = Path(__file__).parent
DEFAULT_SESSION = HERE / "inventory-reserve-fix.jsonl"


def tool_schemas(messages: list[dict]) -> list[dict]:
    names = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in names
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("session", nargs="?", type=Path, default=DEFAULT_SESSION)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--strategy", help="x-foldgate-strategy header (default: the gateway's)")
    args = parser.parse_args()

    record = json.loads(args.session.read_text().splitlines()[0])
    messages = record["messages"]
    tools = tool_schemas(messages)
    client = OpenAI(base_url=args.base_url, api_key="unused")
    headers = {"x-session-id": f"example-{uuid.uuid4().hex[:8]}"}
    if args.strategy:
        headers["x-foldgate-strategy"] = args.strategy
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    print(f"{'step':>4} {'raw':>7} {'rendered':>8} {'upstream':>8} {'cached':>7}  replica")
    totals = {"raw": 0, "rendered": 0, "cached": 0, "upstream": 0}
    for step, end in enumerate(replies):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=messages[:end],
            tools=tools or None,
            max_tokens=args.max_tokens,
            extra_headers=headers,
        )
        completion = raw.parse()
        usage = completion.usage
        details = usage.prompt_tokens_details if usage else None
        cached = (details.cached_tokens or 0) if details else 0
        row = {
            "raw": int(raw.headers["x-foldgate-prompt-tokens-raw"]),
            "rendered": int(raw.headers["x-foldgate-prompt-tokens-rendered"]),
            "upstream": usage.prompt_tokens if usage else 0,
            "cached": cached,
        }
        for key, value in row.items():
            totals[key] += value
        print(
            f"{step:>4} {row['raw']:>7} {row['rendered']:>8} {row['upstream']:>8} "
            f"{row['cached']:>7}  {raw.headers['x-foldgate-replica']}"
        )
    hit = totals["cached"] / totals["upstream"] if totals["upstream"] else 0.0
    print(
        f"total: raw {totals['raw']} -> rendered {totals['rendered']} (estimated tokens; "
        f"{savings(totals['raw'], totals['rendered'])}); upstream prompt tokens "
        f"{totals['upstream']}, {hit:.0%} served from the replica's prefix cache"
    )


def savings(raw: int, rendered: int) -> str:
    """Says "saved" only for a saving, and plainly when the rendering cost more."""
    if rendered < raw:
        return f"{1 - rendered / raw:.1%} saved"
    if rendered == raw:
        return "no saving: rendered as sent"
    return f"no saving: the rendering is {rendered / raw - 1:.1%} larger than the history"


if __name__ == "__main__":
    main()
