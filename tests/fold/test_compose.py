"""Composition: the outer renderer works on what the inner rendered."""

from __future__ import annotations

import pytest

from gateway.fold.baselines import Base, Clip, Mask
from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message


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


def test_outer_cliff_leaves_an_inner_rendering_under_budget_alone() -> None:
    history = tool_history(*OUTPUTS)
    masked = Mask(keep_last=3).render(history)
    budget = sum(chars(m) for m in masked.transcript.messages)
    out = Composed(Mask(keep_last=3), Cliff(budget, count_tokens=chars)).render(history)
    assert out.transcript == masked.transcript
    assert out.stats.compactions == 0
    assert out.stats.stubs == masked.stats.stubs == 11
    assert out.stats.steps == 14


def test_outer_cliff_compacts_the_inner_rendering_when_still_over_budget() -> None:
    history = tool_history(*(f"out {i} " + "w" * 600 for i in range(14)))
    masked = Mask(keep_last=6).render(history).transcript
    budget = sum(chars(m) for m in masked.messages) - 1
    out = Composed(Mask(keep_last=6), Cliff(budget, count_tokens=chars)).render(history)
    got = out.transcript.messages
    assert out.stats.compactions == 1
    assert out.stats.notes == ()
    assert got[3:] == masked.messages[len(masked.messages) - len(got) + 3 :]
    # The cliff summarised the mask's one-liners, not the original outputs.
    assert "result of bash: [output of step 0 omitted]" in got[2].text.split("\n")
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
        cold = renderer.render(prefix)
        assert warm.transcript == cold.transcript
        assert warm.stats == cold.stats
        assert isinstance(warm.cache, tuple) and len(warm.cache) == 2
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
