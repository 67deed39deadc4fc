"""Composition: the outer renderer works on what the inner rendered."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.baselines import Base, Clip, Mask
from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.fold.renderer import Rendered, Renderer
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message
from tests.fold.test_cliff import histories


def chars(message: Message) -> int:
    return len(message.text) + sum(len(c.arguments) for c in message.tool_calls)


def tool_history(*outputs: str) -> Transcript:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i, out in enumerate(outputs):
        messages.append(Message("assistant", (Text(f"step {i}"), ToolCall(f"c{i}", "bash", "{}"))))
        messages.append(Message("tool", (Text(out),), tool_call_id=f"c{i}"))
    return Transcript(tuple(messages))


OUTPUTS = tuple(f"out {i} " + "w" * 400 for i in range(14))


def test_name_joins_the_parts() -> None:
    assert Composed(Mask(), Cliff(100)).name == "mask+cliff"
    assert Composed(Composed(Base(), Clip()), Cliff(100)).name == "base+clip+cliff"


def test_outer_cliff_leaves_an_inner_rendering_alone_while_the_history_fits() -> None:
    history = tool_history(*OUTPUTS)
    masked = Mask(keep_last=3).render(history)
    budget = sum(chars(m) for m in history.messages)
    out = Composed(Mask(keep_last=3), Cliff(budget, count_tokens=chars)).render(history)
    assert out.transcript == masked.transcript
    assert out.stats.compactions == 0
    assert out.stats.stubs == masked.stats.stubs == 11
    assert out.stats.steps == 14


def test_outer_cliff_compacts_where_the_cliff_alone_does() -> None:
    # The inner's rendering fits, the history does not: the cliff alone compacts here, so
    # the composition does too (and sends the inner's rendering of what it keeps).
    history = tool_history(*OUTPUTS)
    masked = Mask(keep_last=3).render(history)
    budget = sum(chars(m) for m in masked.transcript.messages)
    out = Composed(Mask(keep_last=3), Cliff(budget, count_tokens=chars)).render(history)
    alone = Cliff(budget, count_tokens=chars).render(history)
    assert out.stats.compactions == alone.stats.compactions > 0
    assert out.transcript.messages[:3] == alone.transcript.messages[:3]
    assert sum(map(chars, out.transcript.messages)) <= sum(map(chars, alone.transcript.messages))


def test_outer_cliff_compacts_the_inner_rendering_when_still_over_budget() -> None:
    history = tool_history(*(f"out {i} " + "w" * 600 for i in range(14)))
    masked = Mask(keep_last=6).render(history).transcript
    budget = sum(chars(m) for m in masked.messages) - 1
    out = Composed(Mask(keep_last=6), Cliff(budget, count_tokens=chars)).render(history)
    got = out.transcript.messages
    alone = Cliff(budget, count_tokens=chars).render(history)
    assert out.stats.compactions == alone.stats.compactions
    assert out.stats.notes == ()
    assert got[3:] == masked.messages[len(masked.messages) - len(got) + 3 :]
    # The cliff summarised the history's outputs (as the cliff alone would), not the
    # mask's one-liners.
    assert "result of bash: dropped (606 characters)" in got[2].text.split("\n")
    assert "[output of step 0 omitted]" not in got[2].text
    assert out.stats.steps == 14  # steps come from the inner: they name history steps


def test_cache_pair_gives_the_same_rendering_as_no_cache() -> None:
    # Mask rewrites an old output at every step, so the outer's history is not append-only:
    # its cache must notice and replay.
    history = tool_history(*OUTPUTS)
    renderer = Composed(Mask(keep_last=3), Cliff(1_500, count_tokens=chars))
    cache = None
    for n in range(1, len(history.messages) + 1):
        prefix = history.with_messages(history.messages[:n])
        warm = renderer.render(prefix, cache=cache)
        assert_renders_as_cold(renderer, prefix, warm)
        cache = warm.cache


def test_overflow_ladder_goes_through_the_outer() -> None:
    history = tool_history(*OUTPUTS)
    composed = Composed(Clip(), Cliff(10**6, count_tokens=chars))
    normal = composed.render(history).transcript
    ladder = list(composed.compact_for_overflow(history))
    assert ladder
    sizes = [sum(chars(m) for m in r.transcript.messages) for r in ladder]
    assert sizes[0] < sum(chars(m) for m in normal.messages)
    assert sizes == sorted(sizes, reverse=True)
    assert all(r.stats.compactions == 1 for r in ladder)


def test_no_overflow_ladder_without_a_cliff_outside() -> None:
    assert list(Composed(Cliff(100), Mask()).compact_for_overflow(tool_history("a"))) == []


def test_parts_must_be_renderers() -> None:
    with pytest.raises(TypeError, match="outer must be a Renderer"):
        Composed(Base(), "cliff")  # type: ignore[arg-type]


# -- an outer cliff keeps its cut across the inner's rewrites ------------------------------


class ShrinkOld(Renderer):
    """A test inner that rewrites in place, as ReFold does at its boundary moves: every
    tool output older than the last ``keep`` loses all but its first ``keep_chars``."""

    name = "shrink"

    def __init__(self, keep: int = 2, keep_chars: int = 8) -> None:
        self.keep = keep
        self.keep_chars = keep_chars

    def render(self, history: Transcript, state: Any = None, cache: Any = None) -> Rendered:
        outputs = [i for i, m in enumerate(history.messages) if m.role == "tool"]
        messages = list(history.messages)
        for i in outputs[: max(0, len(outputs) - self.keep)]:
            messages[i] = messages[i].with_text(messages[i].text[: self.keep_chars])
        return Rendered(history.with_messages(messages))


def assert_renders_as_cold(renderer: Renderer, request: Transcript, warm: Rendered) -> None:
    """``warm`` (rendered from a cache) is what ``renderer`` renders of ``request`` from none."""
    cold = renderer.render(request)
    assert warm.transcript == cold.transcript
    assert warm.stats == cold.stats


def requests(history: Transcript) -> list[Transcript]:
    """What a harness sends: the history before every assistant message, then all of it."""
    points = [i for i, m in enumerate(history.messages) if m.role == "assistant"]
    return [history.with_messages(history.messages[:p]) for p in [*points, len(history.messages)]]


def session(renderer: Renderer, history: Transcript) -> list[Rendered]:
    """Every request of ``history`` rendered in order, the cache carried along."""
    out, cache = [], None
    for request in requests(history):
        rendered = renderer.render(request, cache=cache)
        out.append(rendered)
        cache = rendered.cache
    return out


LONG = tuple(f"out {i} " + "w" * 600 for i in range(30))  # over the 500-character rule


def test_a_rewrite_below_the_cut_changes_nothing_that_is_sent() -> None:
    # The inner shrinks outputs 14 steps back: once compacted, always below the cut.
    history = tool_history(*LONG)
    composed = Composed(ShrinkOld(keep=14), Cliff(4_000, keep_turns=3, count_tokens=chars))
    rendered = session(composed, history)
    assert rendered[-1].stats.compactions >= 3
    for before, after in pairwise(rendered):
        if before.stats.compactions and after.stats.compactions == before.stats.compactions:
            old = before.transcript.messages
            assert after.transcript.messages[: len(old)] == old


def test_following_cliff_keeps_its_summary_across_an_inner_rewrite() -> None:
    history = tool_history(*LONG[:12])
    # Only the request over the whole history crosses: one compaction.
    cliff = Cliff(sum(chars(m) for m in history.messages) - 1, count_tokens=chars)
    first = cliff.follow(history)
    assert first.stats.compactions == 1
    summary = first.transcript.messages[2]
    cut = len(history.messages) - len(first.transcript.messages) + 3
    # An inner rewrote every summarised output in place (same places, roles, call ids),
    # and the session went on by one step.
    grown = tool_history(*LONG[:13]).messages
    context = [
        m.with_text("short") if m.role == "tool" and i < cut else m for i, m in enumerate(grown)
    ]
    again = cliff.follow(history.with_messages(context), first.cache)
    assert again.stats.compactions == 1
    assert again.transcript.messages[: len(first.transcript.messages)] == first.transcript.messages
    # Not following, a history whose prefix changed is another one: it starts over.
    assert (
        cliff.render(history.with_messages(context), cache=first.cache).transcript.messages[2]
        != summary
    )


def test_the_summary_is_written_from_the_history_as_cliff_alone_writes_it() -> None:
    history = tool_history(*LONG[:12])
    # The inner shrank every output below 500 characters: summarised from the rendering,
    # they would read verbatim where the cliff alone writes "dropped".
    shrunk = ShrinkOld(keep=0, keep_chars=400).render(history).transcript
    cliff = Cliff(sum(chars(m) for m in shrunk.messages) - 1, count_tokens=chars)
    followed = cliff.follow(shrunk, None, history.messages).transcript.messages
    entries = followed[2].text.split("\n")[1:]
    results = [e for e in entries if e.startswith("result of bash")]
    assert results and all(e == "result of bash: dropped (606 characters)" for e in results)
    assert followed[3:] == shrunk.messages[len(shrunk.messages) - len(followed) + 3 :]
    # Without the source (or with one that does not line up) it summarises what it got.
    own = cliff.follow(shrunk, None, history.messages[:5]).transcript.messages
    assert any(e.startswith("result of bash: out ") for e in own[2].text.split("\n"))


def test_a_kept_part_the_inner_shrinks_does_not_postpone_the_compaction() -> None:
    # A postponed compaction keeps the context near the budget where the cliff alone sends
    # it compacted: the composition compacts where the cliff alone does, and sends less.
    history = tool_history(*LONG)
    alone = session(Cliff(4_000, keep_turns=3, count_tokens=chars), history)
    composed = session(
        Composed(ShrinkOld(keep=3, keep_chars=100), Cliff(4_000, keep_turns=3, count_tokens=chars)),
        history,
    )
    assert composed[-1].stats.compactions == alone[-1].stats.compactions > 0
    sent = [sum(chars(m) for m in r.transcript.messages) for r in composed]
    assert sum(sent) < sum(sum(chars(m) for m in r.transcript.messages) for r in alone)


@settings(max_examples=80, deadline=None)
@given(histories(), st.integers(200, 3_000), st.integers(0, 4), st.integers(0, 700))
def test_a_shrinking_inner_never_sends_more_than_cliff_alone(
    history: Transcript, threshold: int, keep: int, keep_chars: int
) -> None:
    alone = session(Cliff(threshold, keep_turns=2, count_tokens=chars), history)
    inner = ShrinkOld(keep=keep, keep_chars=keep_chars)
    composed = session(Composed(inner, Cliff(threshold, keep_turns=2, count_tokens=chars)), history)
    for one, both in zip(alone, composed, strict=True):
        assert sum(map(chars, both.transcript.messages)) <= sum(map(chars, one.transcript.messages))
        assert both.stats.compactions == one.stats.compactions


@settings(max_examples=40, deadline=None)
@given(histories(), st.integers(200, 3_000))
def test_base_inside_is_exactly_cliff_alone(history: Transcript, threshold: int) -> None:
    cliff = Cliff(threshold, keep_turns=2, count_tokens=chars)
    composed = Composed(Base(), Cliff(threshold, keep_turns=2, count_tokens=chars))
    for alone, both in zip(session(cliff, history), session(composed, history), strict=True):
        assert both.transcript == alone.transcript
        assert both.stats.compactions == alone.stats.compactions


@settings(max_examples=80, deadline=None)
@given(histories(), st.integers(200, 3_000), st.integers(0, 4), st.integers(0, 700))
def test_a_shrinking_inner_never_compacts_more_than_cliff_alone(
    history: Transcript, threshold: int, keep: int, keep_chars: int
) -> None:
    alone = session(Cliff(threshold, keep_turns=2, count_tokens=chars), history)
    inner = ShrinkOld(keep=keep, keep_chars=keep_chars)
    composed = session(Composed(inner, Cliff(threshold, keep_turns=2, count_tokens=chars)), history)
    assert composed[-1].stats.compactions <= alone[-1].stats.compactions


@settings(max_examples=40, deadline=None)
@given(histories(), st.integers(200, 3_000))
def test_following_cache_gives_the_same_rendering_as_no_cache(
    history: Transcript, threshold: int
) -> None:
    composed = Composed(ShrinkOld(keep=2), Cliff(threshold, keep_turns=2, count_tokens=chars))
    for request, warm in zip(requests(history), session(composed, history), strict=True):
        assert_renders_as_cold(composed, request, warm)


# -- a new threshold over the same inner (the context guard's calibration) ----------------


def cache_before_last(renderer: Renderer, history: Transcript) -> Any:
    """The cache after every request of ``history`` but its last, rendered in order."""
    return session(renderer, history.with_messages(requests(history)[-2].messages))[-1].cache


class CountedShrink(ShrinkOld):
    """``ShrinkOld`` that counts its renders."""

    def __init__(self) -> None:
        super().__init__(keep=2)
        self.renders = 0

    def render(self, history: Transcript, state: Any = None, cache: Any = None) -> Rendered:
        self.renders += 1
        return super().render(history, state, cache)


@settings(max_examples=60, deadline=None)
@given(histories(), st.lists(st.integers(200, 3_000), min_size=1, max_size=4), st.data())
def test_a_new_threshold_renders_as_that_threshold_from_the_start(
    history: Transcript, thresholds: list[int], data: st.DataObject
) -> None:
    # The session's renderer changes at some requests, each time to a cliff at another
    # threshold over the same inner; every request still renders exactly as the cliff at
    # its threshold renders it from no cache (a whole replay).
    inner = ShrinkOld(keep=2)
    outers = [Composed(inner, Cliff(t, keep_turns=2, count_tokens=chars)) for t in thresholds]
    cache = None
    for request in requests(history):
        renderer = outers[data.draw(st.integers(0, len(outers) - 1))]
        warm = renderer.render(request, cache=cache)
        assert_renders_as_cold(renderer, request, warm)
        cache = warm.cache


def test_a_new_threshold_no_point_came_near_keeps_the_renderings() -> None:
    inner = CountedShrink()
    history = tool_history(*OUTPUTS)  # ~6k characters at its end
    cache = cache_before_last(
        Composed(inner, Cliff(100_000, keep_turns=2, count_tokens=chars)), history
    )
    inner.renders = 0
    second = Composed(inner, Cliff(50_000, keep_turns=2, count_tokens=chars))
    second.render(requests(history)[-1], cache=cache)
    assert inner.renders == 1  # the request alone, as under the same threshold: no replay


def test_a_new_threshold_a_point_came_above_replays_the_history() -> None:
    inner = CountedShrink()
    history = tool_history(*OUTPUTS)
    cache = cache_before_last(
        Composed(inner, Cliff(100_000, keep_turns=2, count_tokens=chars)), history
    )
    inner.renders = 0
    # Lower than what the history came to: the new cliff would have compacted earlier.
    second = Composed(inner, Cliff(3_000, keep_turns=2, count_tokens=chars))
    rendered = second.render(requests(history)[-1], cache=cache)
    assert inner.renders == len(OUTPUTS) + 1  # every request point again
    assert rendered.stats.compactions > 0


def test_a_higher_threshold_after_a_compaction_renders_as_that_threshold() -> None:
    # The lower cliff compacted; the higher one, which never would have, replays.
    inner = ShrinkOld(keep=2)
    history = tool_history(*OUTPUTS)
    cache = cache_before_last(
        Composed(inner, Cliff(3_000, keep_turns=2, count_tokens=chars)), history
    )
    high = Composed(inner, Cliff(100_000, keep_turns=2, count_tokens=chars))
    warm = high.render(requests(history)[-1], cache=cache)
    assert warm.stats.compactions == 0
    assert warm.transcript == high.render(requests(history)[-1]).transcript
