"""The render step as the pipeline calls it: ``Render`` (``gateway.steps.render``) over an
ingested request and the history with the gateway's turns, giving a frozen ``Rendering``.

``Render`` reads a request's fields by name and writes what it found (the KV pressure it
priced at, its stats, its cache entry) back into the object it is given; ``RenderCall``
is that object, made for one call and read back into the ``Rendering`` right after, so
nothing else on the path is written after construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.dialects.anthropic_context import AppliedEdit
from gateway.fold.renderer import RenderState, RenderStats
from gateway.fold.spec import StrategySpec
from gateway.request_cache import MessageMemo
from gateway.steps.ingest import Ingested
from gateway.transcript import Message, Transcript
from store import Lookup

if TYPE_CHECKING:  # render.py names RenderCall in its signatures
    from gateway.steps.render import Render


@dataclass(slots=True)
class RenderCall:
    """What ``Render`` reads of a request, and the fields it writes back."""

    tenant: str
    session: str
    strategy: StrategySpec
    fold: str
    budget: int | None
    transcript: Transcript
    found: Lookup
    history: list[Message]
    state: RenderState
    memo: MessageMemo
    raw_tokens: int
    branch: int | None
    pressure: float = 0.0
    stats: RenderStats = field(default_factory=RenderStats)
    render_cache: Any = None
    applied_edits: tuple[AppliedEdit, ...] | None = None


@dataclass(frozen=True, slots=True)
class Rendering:
    """What was rendered: the transcript for the upstream, its token estimate, the
    strategy's stats, the KV pressure its rewrites were priced at, and the context edits
    applied for the request's ``context_management`` (None: it asked for none)."""

    transcript: Transcript
    tokens: int
    stats: RenderStats
    pressure: float
    call: RenderCall  # for ``keep``, once the history is stored
    applied_edits: tuple[AppliedEdit, ...] | None = None


def render(
    renders: Render,
    ingested: Ingested,
    history: list[Message],
    state: RenderState,
    branch: int | None = None,
) -> Rendering:
    """Render ``history`` (the request's messages with the gateway's turns in place);
    ``branch``: where the history is stored, once it is (the renderer cache is kept then)."""
    caller = ingested.caller
    call = RenderCall(
        tenant=caller.tenant,
        session=ingested.session,
        strategy=caller.strategy,
        fold=caller.fold,
        budget=caller.budget,
        transcript=ingested.transcript,
        found=ingested.found,
        history=history,
        state=state,
        memo=ingested.memo,
        raw_tokens=ingested.raw_tokens,
        branch=branch,
    )
    transcript, tokens = renders(call)
    return Rendering(transcript, tokens, call.stats, call.pressure, call, call.applied_edits)


def keep(renders: Render, rendering: Rendering, branch: int) -> None:
    """Keep the rendering's renderer cache for the session's next request, under the branch
    the history was stored on."""
    renders.keep(replace(rendering.call, branch=branch))
