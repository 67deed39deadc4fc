"""The ledger: what each request of a session cost and what the gateway did to it.

Running totals are the store's counters (atomic increments, exact under concurrency);
``log``, one record per request in arrival order, is the branch's request log, appended by
the same call (``gateway.steps.account``). A record keeps ``messages``, the length of the
history the request carried, so what the model saw at that request can be rendered again
from the stored history, which never changes (``gateway.session_view``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from gateway.transcript import tool_name
from store import SessionStore

# Totals summed over the branch's requests.
SUMMED = (
    "requests",
    "raw_tokens",
    "rendered_tokens",
    "upstream_prompt_tokens",
    "upstream_cached_tokens",
    "rendered_tokens_added",
    "rendered_tokens_removed_by_stubs",
    "rendered_tokens_removed_by_folds",
    "restores",
    "overflow_retries",
)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request. Token figures: ``raw``/``rendered`` are the gateway's estimates
    (bytes/4) of what the harness sent and what went upstream; ``upstream_*`` are what the
    replica reported (its tokenizer, its prefix cache), summed over restore attempts.

    ``fold``, ``pressure`` and ``tools`` are what the rendering depended on besides the
    history: ReFold's fold mode, the KV pressure its rewrites were priced at, and whether
    (which) tools the request offered."""

    messages: int
    strategy: str
    fold: str
    pressure: float
    tools: tuple[str, ...]
    replica: str
    raw_tokens: int
    rendered_tokens: int
    upstream_prompt_tokens: int
    upstream_cached_tokens: int
    # Where the tokens went in the context sent (estimates): what the strategy added
    # (protocol text, labels, notes, its tool) and what its stubs and folds removed.
    rendered_tokens_added: int
    rendered_tokens_removed_by_stubs: int
    rendered_tokens_removed_by_folds: int
    # The rendering's own counts: stubs and folded steps in the context sent, and how many
    # times the strategy rewrote already-sent context or compacted the history so far.
    stubs: int
    folds: int
    rewrites: int
    compactions: int
    restores: int
    # Smaller renderings tried after the replica refused the context as too long.
    overflow_retries: int
    at: float
    # Seconds it waited for working-set admission (0.0: it did not), and the vLLM
    # priority sent with it (0 with upstream_priority off): gateway.steps.kv.
    admission_wait_s: float
    priority: int

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RequestRecord:
        """A stored record; fields it predates read as empty (0, "", no tools)."""
        empty = {"int": 0, "float": 0.0, "str": ""}
        values: dict[str, Any] = {}
        for f in fields(cls):
            default = () if f.name == "tools" else empty[str(f.type)]
            values[f.name] = raw.get(f.name, default)
        values["tools"] = tuple(values["tools"])
        return cls(**values)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The names of a request's tool schemas (OpenAI's nested or Anthropic's flat shape)."""
    return tuple(name if isinstance(name := tool_name(tool), str) else "?" for tool in tools)


RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))


def as_dict(request: RequestRecord) -> dict[str, Any]:
    """``dataclasses.asdict`` for a record of flat values (it deep-copies each one)."""
    return {name: getattr(request, name) for name in RECORD_FIELDS}


@dataclass(frozen=True, slots=True)
class Ledger:
    totals: dict[str, int]
    log: tuple[RequestRecord, ...]


async def read(store: SessionStore, tenant: str, session: str, branch: int) -> Ledger:
    """The branch's ledger; ``store.NotFound`` when the session or branch does not exist."""
    counts = await store.get_counts(tenant, session, branch)
    records = await store.get_log(tenant, session, branch)
    return Ledger(
        {name: int(counts.get(name, 0)) for name in SUMMED},
        tuple(RequestRecord.from_dict(json.loads(r)) for r in records),
    )
