"""CliffCompaction on small hand-built transcripts, tool-calling and text-action forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.cliff import Cliff
from gateway.transcript import (
    Message,
    Text,
    Thinking,
    ToolCall,
    Transcript,
    text_message,
    tool_message,
)

HEADER = (
    "[Earlier conversation compacted: {n} messages are summarised below, oldest first. "
    "Tool calls are shown as signatures; tool results longer than 500 characters were "
    "dropped.]"
)


def chars(message: Message) -> int:
    """A token counter tests can do arithmetic with: one token per character."""
    size = len(message.text) + len(message.thinking)
    return size + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)


def total(messages: tuple[Message, ...]) -> int:
    return sum(chars(m) for m in messages)


def call(text: str, call_id: str, name: str, args: str, thinking: str = "") -> Message:
    parts = ((Thinking(thinking),) if thinking else ()) + (
        Text(text),
        ToolCall(call_id, name, args),
    )
    return Message("assistant", parts)


def tool_history(*outputs: str) -> Transcript:
    """System, task, then one bash call per output."""
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i, out in enumerate(outputs):
        messages += [
            call(f"step {i}", f"c{i}", "bash", f'{{"cmd": "run {i}"}}'),
            tool_message(f"c{i}", out),
        ]
    return Transcript(tuple(messages))


def text_history(*outputs: str) -> Transcript:
    """Text-action form: actions in assistant text, observations as user messages."""
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i, out in enumerate(outputs):
        messages += [text_message("assistant", f"run {i}"), text_message("user", out)]
    return Transcript(tuple(messages))


def summary_of(rendered: Transcript) -> str:
    assert rendered.messages[2].role == "user"
    return rendered.messages[2].text


def test_under_threshold_renders_history_unchanged() -> None:
    history = tool_history("a" * 100, "b" * 100, "c" * 100, "d" * 100, "e" * 100)
    out = Cliff(total(history.messages), count_tokens=chars).render(history)
    assert out.transcript == history
    assert out.stats.compactions == 0
    assert not out.stats.over_budget
    assert out.stats.steps == 5


def test_crossing_gives_head_one_summary_and_last_three_turns() -> None:
    history = tool_history("a.py b.py", "x" * 600, "ok", "passed", "done")
    # Only the request over the whole history crosses: every earlier prefix is smaller.
    cliff = Cliff(total(history.messages) - 1, count_tokens=chars)
    out = cliff.render(history)
    got = out.transcript.messages
    assert got[:2] == history.messages[:2]
    assert got[3:] == history.messages[6:]
    assert got[3].role == "assistant"
    assert summary_of(out.transcript) == "\n".join(
        [
            HEADER.format(n=4),
            "assistant: step 0",
            'call: bash({"cmd": "run 0"})',
            "result of bash: a.py b.py",
            "assistant: step 1",
            'call: bash({"cmd": "run 1"})',
            "result of bash: dropped (600 characters)",
        ]
    )
    assert out.stats.compactions == 1
    assert out.stats.boundary == 2
    assert out.stats.notes == ()
    assert not out.stats.over_budget


def test_text_action_form_summarises_observations_as_results() -> None:
    history = text_history("short", "y" * 501, "ok", "fine", "last")
    out = Cliff(total(history.messages) - 1, count_tokens=chars).render(history)
    got = out.transcript.messages
    assert got[3:] == history.messages[6:]
    assert got[3].role == "assistant"
    assert summary_of(out.transcript).split("\n")[1:] == [
        "assistant: run 0",
        "observation: short",
        "assistant: run 1",
        "observation: dropped (501 characters)",
    ]


def test_results_of_exactly_500_chars_stay_verbatim() -> None:
    history = tool_history("k" * 500, "z" * 900, "ok", "ok", "ok")
    out = Cliff(total(history.messages) - 1, count_tokens=chars).render(history)
    lines = summary_of(out.transcript).split("\n")
    assert f"result of bash: {'k' * 500}" in lines
    assert "result of bash: dropped (900 characters)" in lines


def test_call_signature_cuts_arguments_to_150_chars() -> None:
    args = '{"cmd": "' + "q" * 400 + '"}'
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    messages += [call("", "c0", "bash", args), tool_message("c0", "r" * 2000)]
    messages += [call("", f"c{i}", "bash", "{}") for i in (1,)] + [tool_message("c1", "ok")]
    messages += [call("", "c2", "bash", "{}"), tool_message("c2", "ok")]
    messages += [call("", "c3", "bash", "{}"), tool_message("c3", "ok")]
    history = Transcript(tuple(messages))
    out = Cliff(total(history.messages) - 1, count_tokens=chars).render(history)
    lines = summary_of(out.transcript).split("\n")
    assert lines[1] == f"call: bash({args[:150]}… [{len(args) - 150} more characters])"


def test_caps_on_user_assistant_and_thinking_text() -> None:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    messages += [call("A" * 50, "c0", "bash", "{}", thinking="T" * 40)]
    messages += [tool_message("c0", "o" * 1000), text_message("user", "U" * 30)]
    for i in range(1, 4):
        messages += [call("", f"c{i}", "bash", "{}"), tool_message(f"c{i}", "z" * 100)]
    history = Transcript(tuple(messages))
    cliff = Cliff(
        total(history.messages) - 1,
        user_cap=10,
        assistant_cap=20,
        thinking_cap=5,
        count_tokens=chars,
    )
    lines = summary_of(cliff.render(history).transcript).split("\n")
    assert lines[1:] == [
        "assistant thinking: TTTTT… [35 more characters]",
        f"assistant: {'A' * 20}… [30 more characters]",
        "call: bash({})",
        "result of bash: dropped (1000 characters)",
        f"user: {'U' * 10}… [20 more characters]",
    ]


def test_cap_none_keeps_assistant_text_whole_and_cap_zero_leaves_thinking_out() -> None:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    messages += [call("A" * 3000, "c0", "bash", "{}", thinking="T" * 50)]
    messages += [tool_message("c0", "o" * 5000)]
    for i in range(1, 4):
        messages += [call("", f"c{i}", "bash", "{}"), tool_message(f"c{i}", "z")]
    history = Transcript(tuple(messages))
    cliff = Cliff(
        total(history.messages) - 1, assistant_cap=None, thinking_cap=0, count_tokens=chars
    )
    lines = summary_of(cliff.render(history).transcript).split("\n")
    assert lines[1:3] == [f"assistant: {'A' * 3000}", "call: bash({})"]


def test_paper_preset_caps_assistant_and_thinking_at_300() -> None:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    messages += [call("A" * 1000, "c0", "bash", "{}", thinking="T" * 1000), tool_message("c0", "o")]
    for i in range(1, 4):
        messages += [call("", f"c{i}", "bash", "{}"), tool_message(f"c{i}", "z" * 100)]
    history = Transcript(tuple(messages))
    lines = summary_of(
        Cliff.paper(total(history.messages) - 1, count_tokens=chars).render(history).transcript
    ).split("\n")
    assert lines[1] == f"assistant thinking: {'T' * 300}… [700 more characters]"
    assert lines[2] == f"assistant: {'A' * 300}… [700 more characters]"


def test_summaries_never_nest_across_compactions() -> None:
    outputs = [f"out {i} " + "w" * 600 for i in range(12)]
    history = tool_history(*outputs)
    out = Cliff(3_000, count_tokens=chars).render(history)
    assert out.stats.compactions >= 2
    rendered = out.transcript.messages
    assert [m.role for m in rendered[:4]] == ["system", "user", "user", "assistant"]
    assert rendered[3:] == history.messages[-6:]
    # The one summary is what a single compaction of the original turns 0-8 would list.
    expected = [HEADER.format(n=18)]
    for i in range(9):
        expected += [
            f"assistant: step {i}",
            f'call: bash({{"cmd": "run {i}"}})',
            f"result of bash: dropped ({len(outputs[i])} characters)",
        ]
    assert summary_of(out.transcript) == "\n".join(expected)


def test_cut_only_moves_when_the_threshold_is_crossed() -> None:
    outputs = [f"out {i} " + "w" * 300 for i in range(12)]
    history = tool_history(*outputs)
    cliff = Cliff(1_800, count_tokens=chars)
    previous = None
    for n in range(2, len(history.messages) + 1):
        out = cliff.render(history.with_messages(history.messages[:n]))
        if previous is not None and out.stats.compactions == previous.stats.compactions:
            # No new compaction: the context only grew at its end (prefix cache stays valid).
            old = previous.transcript.messages
            assert out.transcript.messages[: len(old)] == old
        previous = out
    assert previous is not None and previous.stats.compactions >= 2


def test_ladder_keeps_one_turn_when_three_do_not_fit() -> None:
    history = tool_history("a" * 10, "b" * 10, "c" * 600, "d" * 600, "e" * 10)
    # The summary's own header outweighs what keeping 3 turns would save here.
    out = Cliff(total(history.messages) - 1, count_tokens=chars).render(history)
    got = out.transcript.messages
    assert got[3:] == history.messages[-2:]
    assert out.stats.notes == ("cliff ladder: kept 1 recent turn",)
    assert not out.stats.over_budget


def test_ladder_caps_thoughts_harder_then_cuts_the_summary_oldest_first() -> None:
    messages = [text_message("system", "SYS"), text_message("user", "TASK")]
    for i in range(4):
        messages += [call("A" * 400, f"c{i}", "bash", "{}"), tool_message(f"c{i}", "r")]
    history = Transcript(tuple(messages))
    # With one kept turn (~400 tokens) the summary's three 400-char texts must shrink.
    out = Cliff(1_100, count_tokens=chars).render(history)
    lines = summary_of(out.transcript).split("\n")
    assert out.stats.notes == ("cliff ladder: kept 1 recent turn, thoughts capped harder",)
    assert lines[1] == f"assistant: {'A' * 100}… [300 more characters]"
    assert out.transcript.messages[3:] == history.messages[-2:]

    tight = Cliff(700, count_tokens=chars).render(history)
    lines = summary_of(tight.transcript).split("\n")
    assert tight.stats.notes[-1].endswith("summary cut oldest-first")
    turn = [f"assistant: {'A' * 100}… [300 more characters]", "call: bash({})", "result of bash: r"]
    entries = turn * 3
    dropped = len(entries) - len(lines[2:])
    assert lines[1] == f"[The {dropped} oldest summary entries were cut to fit the context.]"
    assert lines[2:] == entries[dropped:]
    assert total(tight.transcript.messages) <= 700
    assert not tight.stats.over_budget


def test_over_budget_when_even_the_last_turn_does_not_fit() -> None:
    history = tool_history("a", "b", "c" * 5_000)
    out = Cliff(1_000, count_tokens=chars).render(history)
    assert out.stats.over_budget
    assert out.transcript.messages[-2:] == history.messages[-2:]
    assert out.transcript.messages[3].role == "assistant"


def test_context_without_turns_cannot_compact() -> None:
    history = Transcript((text_message("system", "S" * 50), text_message("user", "U" * 50)))
    out = Cliff(10, count_tokens=chars).render(history)
    assert out.transcript == history
    assert out.stats.compactions == 0
    assert out.stats.over_budget


def test_overflow_ladder_forces_smaller_renderings() -> None:
    history = tool_history(*(f"o{i} " + "v" * 200 for i in range(8)))
    cliff = Cliff(10**6, count_tokens=chars)
    normal = cliff.render(history)
    assert normal.transcript == history
    sizes = [total(r.transcript.messages) for r in cliff.compact_for_overflow(history)]
    assert sizes
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(sizes)) == len(sizes)
    assert sizes[0] < total(history.messages)
    ladder = list(cliff.compact_for_overflow(history))
    assert all(r.stats.compactions == 1 for r in ladder)
    assert all(r.transcript.messages[3].role == "assistant" for r in ladder)


def test_cache_from_another_branch_is_not_reused() -> None:
    cliff = Cliff(1_500, count_tokens=chars)
    a = tool_history(*(f"a{i} " + "w" * 300 for i in range(8)))
    b = tool_history(*(f"b{i} " + "w" * 300 for i in range(8)))
    cached = cliff.render(b, cache=cliff.render(a).cache)
    assert cached.transcript == cliff.render(b).transcript


@pytest.mark.parametrize(
    "kwargs",
    [
        {"threshold": 0},
        {"threshold": -5},
        {"threshold": 100, "keep_turns": 0},
        {"threshold": 100, "result_max": -1},
        {"threshold": 100, "assistant_cap": -1},
        {"threshold": "100"},
    ],
)
def test_bad_parameters_are_named(kwargs: dict) -> None:
    name = next(k for k, v in kwargs.items() if not (k == "threshold" and v == 100))
    with pytest.raises(ValueError, match=name):
        Cliff(**kwargs)


# -- properties over random histories ---------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> Transcript:
    text_form = draw(st.booleans())
    messages = [text_message("system", "SYS"), text_message("user", draw(st.text(max_size=50)))]
    counter = 0
    for _ in range(draw(st.integers(0, 14))):
        body = draw(st.text(alphabet="ab \n", max_size=300))
        thinking = draw(st.text(alphabet="t", max_size=200))
        if text_form:
            messages.append(text_message("assistant", body))
            messages.append(text_message("user", draw(st.text(alphabet="xy", max_size=700))))
            continue
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            calls.append(
                ToolCall(f"id{counter}", "bash", draw(st.text(alphabet="{}q", max_size=200)))
            )
            counter += 1
        parts = ((Thinking(thinking),) if thinking else ()) + (Text(body), *calls)
        messages.append(Message("assistant", parts))
        for c in calls:
            messages.append(tool_message(c.id, draw(st.text(alphabet="xy", max_size=700))))
        if draw(st.integers(0, 5)) == 0:
            messages.append(text_message("user", "please go on"))
    return Transcript(tuple(messages))


def assert_pairs_intact(messages: tuple[Message, ...]) -> None:
    for i, m in enumerate(messages):
        if m.role != "tool":
            continue
        j = i - 1
        while messages[j].role == "tool":
            j -= 1
        assert messages[j].role == "assistant"
        assert m.tool_call_id in {c.id for c in messages[j].tool_calls}


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(50, 3_000), st.integers(1, 4))
def test_pairing_and_shape_hold_for_any_history(
    history: Transcript, threshold: int, keep_turns: int
) -> None:
    out = Cliff(threshold, keep_turns=keep_turns, count_tokens=chars).render(history)
    got = out.transcript.messages
    assert_pairs_intact(got)
    assert got[:2] == history.messages[:2]
    if out.stats.compactions:
        assert got[2].role == "user" and got[2].text.startswith("[Earlier conversation")
        tail = got[3:]
        assert not tail or tail[0].role == "assistant"
        assert tail == history.messages[len(history.messages) - len(tail) :]
    else:
        assert out.transcript == history
    assert out.stats.over_budget == (total(got) > threshold)


@settings(max_examples=40, deadline=None)
@given(histories(), st.integers(50, 3_000))
def test_incremental_cache_matches_a_fresh_render(history: Transcript, threshold: int) -> None:
    cliff = Cliff(threshold, keep_turns=2, count_tokens=chars)
    cache = None
    for n in range(1, len(history.messages) + 1):
        prefix = history.with_messages(history.messages[:n])
        warm = cliff.render(prefix, cache=cache)
        cold = cliff.render(prefix)
        assert warm.transcript == cold.transcript
        assert warm.stats == cold.stats
        cache = warm.cache
    again = Cliff(threshold, keep_turns=2, count_tokens=chars).render(history)
    assert again.transcript == cliff.render(history).transcript
