"""The appendix-B baselines: base, mask, clip."""

from __future__ import annotations

import pytest

from gateway.fold.baselines import Base, Clip, Mask, clip_text
from gateway.fold.renderer import RenderState
from gateway.transcript import Message, Opaque, Text, ToolCall, Transcript, text_message


def tool_history(*outputs: str) -> Transcript:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i, out in enumerate(outputs):
        messages.append(Message("assistant", (ToolCall(f"c{i}", "bash", "{}"),)))
        messages.append(Message("tool", (Text(out),), tool_call_id=f"c{i}"))
    return Transcript(tuple(messages))


def text_history(*outputs: str) -> Transcript:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i, out in enumerate(outputs):
        messages += [text_message("assistant", f"run {i}"), text_message("user", out)]
    return Transcript(tuple(messages))


def outputs_of(transcript: Transcript) -> list[str]:
    return [m.text for m in transcript.messages[3::2]]


def test_base_changes_nothing() -> None:
    history = tool_history("a", "b" * 5000)
    out = Base().render(history)
    assert out.transcript == history
    assert out.stats.steps == 2


@pytest.mark.parametrize("build", [tool_history, text_history])
def test_mask_replaces_all_but_the_last_ten_outputs(build) -> None:
    history = build(*(f"output {i}" for i in range(13)))
    out = Mask().render(history)
    assert outputs_of(out.transcript) == [
        "[output of step 0 omitted]",
        "[output of step 1 omitted]",
        "[output of step 2 omitted]",
        *(f"output {i}" for i in range(3, 13)),
    ]
    assert [m.role for m in out.transcript.messages] == [m.role for m in history.messages]
    assert out.stats.steps == 13
    assert out.stats.stubs == 3


def test_mask_keeps_the_call_pairing_and_drops_attachments() -> None:
    history = tool_history("old", "new")
    image = Message("tool", (Text("shot"), Opaque({"type": "image"})), tool_call_id="c0")
    history = history.with_messages((*history.messages[:3], image, *history.messages[4:]))
    out = Mask(keep_last=1).render(history)
    masked = out.transcript.messages[3]
    assert masked.tool_call_id == "c0"
    assert masked.parts == (Text("[output of step 0 omitted]"),)
    assert out.transcript.messages[5] == history.messages[5]


def test_restored_messages_are_not_steps_and_stay_verbatim() -> None:
    history = tool_history(*(f"output {i}" for i in range(12)))
    restored = text_message("user", "restored: output 0")
    history = history.with_messages((*history.messages, restored))
    state = RenderState(restored=frozenset({len(history.messages) - 1}))
    out = Mask(keep_last=10).render(history, state)
    assert out.transcript.messages[-1] == restored
    assert out.stats.steps == 12
    assert outputs_of(out.transcript)[:3] == [
        "[output of step 0 omitted]",
        "[output of step 1 omitted]",
        "output 2",
    ]


def test_clip_cuts_old_long_outputs_to_head_and_tail() -> None:
    long = "".join(chr(ord("a") + i % 26) for i in range(3000))
    history = tool_history(long, "s" * 1000, long, long, long)
    out = Clip().render(history)
    got = outputs_of(out.transcript)
    expected = f"{long[:666]}\n[... 2000 characters clipped ...]\n{long[-334:]}"
    assert got == [expected, "s" * 1000, long, long, long]
    assert out.stats.stubs == 1


def test_clip_keeps_non_text_parts() -> None:
    history = tool_history("x" * 2000, "new", "new", "new")
    image = Message("tool", (Text("x" * 2000), Opaque({"type": "image"})), tool_call_id="c0")
    history = history.with_messages((*history.messages[:3], image, *history.messages[4:]))
    clipped = Clip().render(history).transcript.messages[3]
    assert clipped.parts[1] == Opaque({"type": "image"})
    assert len(clipped.text) < 1100


@pytest.mark.parametrize("size", [0, 1, 7, 999, 1000, 1001, 5000])
def test_clip_text_respects_its_budget(size: int) -> None:
    text = "q" * size
    got = clip_text(text, 1000)
    if size <= 1000:
        assert got == text
    else:
        head, marker, tail = got.split("\n")
        assert (len(head), len(tail)) == (666, 334)
        assert marker == f"[... {size - 1000} characters clipped ...]"


def test_rendering_is_deterministic_and_needs_no_cache() -> None:
    history = tool_history(*("z" * 1500 for _ in range(14)))
    for renderer in (Base(), Mask(), Clip()):
        first = renderer.render(history)
        assert renderer.render(history, cache=first.cache) == first


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: Mask(keep_last=-1), "keep_last"),
        (lambda: Clip(max_chars=-3), "max_chars"),
        (lambda: Clip(keep_last=1.5), "keep_last"),
    ],
)
def test_bad_parameters_are_named(factory, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        factory()
