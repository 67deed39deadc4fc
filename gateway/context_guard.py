"""Keep each request inside the replicas' context window when no budget is configured.

A replica refuses a prompt longer than its window (vLLM's ``max_model_len``) with a 400.
The overflow ladder in the pipeline answers that by compacting from scratch, and the next
request, rendered as before, is refused again. The guard instead learns each replica's
window from its ``/v1/models`` and renders the session with a CliffCompaction over the
strategy (``refold`` -> ``refold+cliff``), at a threshold below the window: the session
compacts once, before it would be refused, and later requests keep the compacted prefix
(the cliff moves its cut only at the next crossing, and ``Composed`` keeps it across the
inner's rewrites). The ladder stays the last resort.

The threshold is a count of the gateway's token estimate (``estimate_tokens``, bytes/4) over
the rendered messages, the unit the cliff counts in:

    threshold = (window - reply) / (ratio * (1 + MARGIN)) - tools

- ``window``: the smallest window among the replicas: a session can fail over to any.
- ``reply``: room for the answer: the request's ``max_tokens``, else
  ``DEFAULT_REPLY_TOKENS``, at most a quarter of the window. vLLM does not refuse a
  ``max_tokens`` larger than the room left (it clamps it), so the reply is not reserved in
  full at any cost.
- ``tools``: the estimate of the tool schemas, which the cliff does not count.
- ``ratio``: the replica's prompt tokens per estimated token, calibrated per session from
  each reply's ``usage.prompt_tokens`` over the estimate of what was sent. The upstream's
  count is the real one (its own tokenizer and chat template, tool preamble included) for
  any model, and costs nothing to get; a local tokenizer would need the served model's
  vocabulary, which the gateway does not know, and CPU on every request. The session's
  last reply gives it: the next prompt is that one plus a little, and a prompt's fixed
  overhead (chat template, tool preamble) inflates the ratio of the small early prompts,
  which a running maximum would keep. Before a session's first reply: the largest ratio
  among the tenant's recent replies (on the safe side), else ``PRIOR_RATIO``. Only the
  tenant's own: another tenant's traffic must not move its thresholds, nor learn from them
  what that traffic is (a side channel).
- ``MARGIN``: one new tool output of dense text (JSON, base64, CJK: 2-3 bytes per token
  against ~4) can raise a prompt's ratio by several percent between two replies.

A new threshold that some request point of the session came above, before or now, makes
its cliff evaluate the history again (a replay of its request points), which may move its
cut (a prefix-cache miss); where none did, the cliff's state carries over as it is and the
strategy's renderings with it (``Cliff.carried``: no replay). So the ratio is rounded up
to steps of ``RATIO_STEP`` and follows a new reading at once only upwards (downwards only
by more than two steps), and once the session has compacted its threshold only goes down,
and only when the window, the ratio or the tools call for it (never for a reply size that
changed).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from gateway.fold.bound import Renderers
from gateway.fold.renderer import Renderer
from gateway.fold.spec import StrategySpec
from gateway.lru import LRU
from gateway.tokens import BYTES_PER_TOKEN
from gateway.transcript import Transcript
from gateway.upstream import UpstreamError
from router.replica import Replica

DEFAULT_REPLY_TOKENS = 4096
PRIOR_RATIO = 1.5
MARGIN = 0.10
RATIO_STEP = 1 / 32
# Sessions whose thresholds are kept, per tenant (least recently rendered out first): one
# tenant's many sessions must not push another's calibrated and compacted ones out.
GUARDED_SESSIONS = 4096
RECENT_RATIOS = 64  # per tenant
RECENT_TENANTS = 1024  # tenants whose recent ratios are kept, least recently observed out

GetJson = Callable[[str], Any]


def reply_room(window: int, max_tokens: Any) -> int:
    """Tokens kept free for the reply: ``max_tokens`` (else the default), at most window/4."""
    usable = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
    wanted = max_tokens if usable else None
    return min(wanted or DEFAULT_REPLY_TOKENS, window // 4)


def rounded_ratio(ratio: float) -> float:
    """``ratio`` rounded up to a multiple of ``RATIO_STEP``."""
    return math.ceil(ratio / RATIO_STEP - 1e-9) * RATIO_STEP


def threshold(window: int, reply: int, ratio: float, tools: int) -> int:
    """The estimated message tokens a request may hold (at least 1; see the module doc)."""
    return max(1, math.floor((window - reply) / (ratio * (1 + MARGIN))) - tools)


def tools_estimate(transcript: Transcript) -> int:
    """The tool schemas in the gateway's estimate (bytes/4 of their JSON)."""
    if not transcript.tools:
        return 0
    return len(json.dumps(list(transcript.tools), ensure_ascii=False).encode()) // BYTES_PER_TOKEN


def tools_digest(transcript: Transcript) -> int:
    """A digest of the tool schemas, for a session to notice they changed without keeping
    them (tens of KB per session, for thousands of sessions)."""
    return xxhash.xxh3_64_intdigest(orjson.dumps(list(transcript.tools))) if transcript.tools else 0


def window_of(models: Any, model: str | None) -> int | None:
    """A ``/v1/models`` answer's ``max_model_len`` for ``model`` (the smallest listed when
    ``model`` is None or not listed); None when no entry reports one."""
    entries = models.get("data") if isinstance(models, Mapping) else None
    if not isinstance(entries, list):
        return None
    lengths = {
        e.get("id"): e["max_model_len"]
        for e in entries
        if isinstance(e, Mapping)
        and isinstance(e.get("max_model_len"), int)
        and e["max_model_len"] > 0
    }
    if model in lengths:
        return lengths[model]
    return min(lengths.values(), default=None)


@dataclass(slots=True)
class _Session:
    ratio: float | None = None  # upstream prompt tokens / estimate sent, rounded (see doc)
    threshold: int | None = None
    reply: int = 0  # the reply room ``threshold`` was derived with
    compacted: bool = False
    sent: int | None = None  # estimate of the last request sent (messages + tools)
    tools: int = 0  # estimate of the tool schemas
    tools_digest: int = 0  # ``tools_digest`` of them


class ContextGuard:
    """Per-session CliffCompaction thresholds below the replicas' context window.

    ``replicas()`` lists the replicas a request may go to; ``get_json(url)`` fetches their
    ``/v1/models`` (raising ``UpstreamError`` when a replica answers none: it is asked again
    with a later request); ``renderers`` builds a strategy with a cliff at the threshold (the
    gateway's one renderer cache, so a session whose threshold stays keeps its renderer and
    its cache). ``renderer`` answers None, and the strategy renders as configured, when the
    guard is off (a budget is configured) or no replica reported a window.
    """

    def __init__(
        self,
        replicas: Callable[[], Iterable[Replica]],
        get_json: GetJson,
        renderers: Renderers,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self._replicas = replicas
        self._get_json = get_json
        self.renderers = renderers
        self._windows: dict[str, int | None] = {}
        self._learning = asyncio.Lock()
        # tenant -> its sessions; at most RECENT_TENANTS tenants, as their ratios.
        self._sessions: LRU[LRU[_Session]] = LRU(RECENT_TENANTS)
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()

    # -- the window ---------------------------------------------------------------------

    async def learn(self, model: str | None) -> None:
        """Ask each replica not asked yet for its window (``/v1/models``): for ``model``
        when the replica lists it, else the smallest it lists."""
        if not self.enabled:
            return
        pending = [r.url for r in self._replicas() if r.url not in self._windows]
        if not pending:
            return
        async with self._learning:
            pending = [url for url in pending if url not in self._windows]
            answers = await asyncio.gather(
                *(self._get_json(f"{url}/v1/models") for url in pending), return_exceptions=True
            )
            for url, answer in zip(pending, answers, strict=True):
                if isinstance(answer, UpstreamError):
                    continue  # asked again with the next request
                if isinstance(answer, BaseException):
                    raise answer
                self._windows[url] = window_of(answer, model)

    def window(self) -> int | None:
        """The smallest window among the replicas that reported one."""
        known = [w for r in self._replicas() if (w := self._windows.get(r.url)) is not None]
        return min(known, default=None)

    # -- per session --------------------------------------------------------------------

    def renderer(
        self,
        key: tuple[str, Hashable],
        strategy: str | StrategySpec,
        transcript: Transcript,
        fold: str | None = None,
    ) -> Renderer | None:
        """The renderer for this request of session ``key`` (tenant, session id), or None
        (see the class doc)."""
        window = self.window() if self.enabled else None
        if window is None:
            return None
        session = self._session(key)
        digest = tools_digest(transcript)
        if digest != session.tools_digest:
            session.tools_digest, session.tools = digest, tools_estimate(transcript)
        tools = session.tools
        tenant, _ = key
        recent = self._recent.get(tenant, ())
        ratio = session.ratio or rounded_ratio(max(recent, default=PRIOR_RATIO))
        reply = reply_room(window, transcript.params.get("max_tokens"))
        if session.threshold is None or not session.compacted:
            session.threshold, session.reply = threshold(window, reply, ratio, tools), reply
        else:
            # Compacted: only what the prompt's own size depends on may lower it.
            session.threshold = min(
                session.threshold, threshold(window, session.reply, ratio, tools)
            )
        return self.renderers.bounded(tenant, strategy, fold, session.threshold)

    def rendered(self, key: tuple[str, Hashable], tokens: int, compacted: bool) -> None:
        """What was sent for session ``key``: its message estimate, and whether its
        rendering holds a compaction."""
        session = self._known(key)
        if session is None:  # not rendered by the guard: nothing to calibrate
            return
        session.sent = tokens + session.tools
        session.compacted = session.compacted or compacted

    def observe(self, key: tuple[str, Hashable], usage: Mapping[str, Any]) -> None:
        """A reply's ``usage`` for what ``rendered`` last recorded of session ``key``."""
        session = self._known(key)
        prompt = usage.get("prompt_tokens")
        if session is None or not session.sent or not isinstance(prompt, int) or prompt <= 0:
            return
        ratio = prompt / session.sent
        self._recent_of(key[0]).append(ratio)
        held = session.ratio
        if held is None or ratio > held or ratio < held - 2 * RATIO_STEP:
            session.ratio = rounded_ratio(ratio)

    def prompt_ratio(self, key: tuple[str, Hashable]) -> float | None:
        """The replicas' prompt tokens per estimated token for session ``key`` (its own
        calibration, else its tenant's latest reply's), for counts that must be in the
        model's tokens; None before any reply of the tenant was observed."""
        session = self._known(key)
        if session is not None and session.ratio is not None:
            return session.ratio
        recent = self._recent.get(key[0])
        return recent[-1] if recent else None

    def _recent_of(self, tenant: str) -> deque[float]:
        recent = self._recent.get(tenant)
        if recent is None:
            recent = self._recent[tenant] = deque(maxlen=RECENT_RATIOS)
        self._recent.move_to_end(tenant)
        while len(self._recent) > RECENT_TENANTS:
            self._recent.popitem(last=False)
        return recent

    def _session(self, key: tuple[str, Hashable]) -> _Session:
        """Session ``key``'s state (made if new), now its tenant's most recently used."""
        tenant = key[0]
        sessions = self._sessions.get(tenant)
        if sessions is None:
            sessions = LRU(GUARDED_SESSIONS)
            self._sessions.put(tenant, sessions)
        session = sessions.get(key)
        if session is None:
            session = _Session()
            sessions.put(key, session)
        return session

    def _known(self, key: tuple[str, Hashable]) -> _Session | None:
        """Session ``key``'s state, if the guard keeps one."""
        sessions = self._sessions.peek(key[0])
        return None if sessions is None else sessions.peek(key)
