from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.fold.folds import fold_runs
from gateway.fold.protocol import FOLD_INSTRUCTION, reminder_text
from gateway.fold.refold import ReFold, ReFoldCache, chunk_boundary
from gateway.fold.renderer import RenderState, step_indices
from gateway.tokens import estimate_tokens
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message, tool_message
from tests.fold.conftest import (
    Turn,
    numbered,
    protocol,
    source_lines,
    text_history,
    tool_history,
    turn,
)

BIG = "\n".join(f"PASSED tests/test_mod.py::test_case_{i}" for i in range(20))
OK = protocol("ok")
# Full KV pressure: a fold is worth as much as a prefill, so the folds of these small
# histories pay (the pricing itself is tested below and in test_pricing.py).
PRESSED = RenderState(pressure=1.0)


def paper(**options: object) -> ReFold:
    """ReFold as the paper runs it: protocol in the system prompt, labels, restore tool."""
    return ReFold(fold="on", **options)  # type: ignore[arg-type]


def out(i: int) -> str:
    """A distinct output of 20 lines (big enough that folding it pays)."""
    return f"output {i}\n" + "\n".join(f"line {j} of output {i}, long enough" for j in range(20))


def outputs(
    rendered: Transcript, history: Transcript, state: RenderState | None = None
) -> list[str]:
    """The rendered text of each step, in order (rendered messages map 1:1 after the head)."""
    head = len(rendered.messages) - len(history.messages)
    return [rendered.messages[head + i].text for i in step_indices(history, state)]


def plain_turns(n: int, reply: str = OK) -> list:
    return [turn(reply, f"output of step {i}") for i in range(n)]


@pytest.mark.parametrize(
    ("t", "k", "b"),
    [(0, 3, 0), (2, 3, 0), (3, 3, 0), (5, 3, 0), (6, 3, 3), (8, 3, 3), (9, 3, 6), (10, 2, 8)],
)
def test_chunk_boundary(t: int, k: int, b: int) -> None:
    assert chunk_boundary(t, k) == b
    history = tool_history(plain_turns(t))
    stats = ReFold(k=k).render(history).stats
    assert (stats.steps, stats.boundary) == (t, b)


def test_bad_k_is_rejected() -> None:
    for k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk size k must be a positive integer"):
            ReFold(k=k)  # type: ignore[arg-type]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="ReFold renders a Transcript, got list"):
        ReFold().render([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="render state must be a RenderState, got dict"):
        ReFold().render(tool_history([]), {})  # type: ignore[arg-type]


def test_every_step_is_labelled_in_the_paper_setting() -> None:
    history = tool_history(plain_turns(4))
    assert outputs(paper().render(history).transcript, history) == [
        f"[step {i}]\noutput of step {i}" for i in range(4)
    ]


def test_duplicates_are_stubbed_when_they_arrive() -> None:
    # Stubbing new text invalidates no cached token: no need to wait for the boundary.
    turns = [turn(OK, BIG), turn(OK, "x"), turn(OK, BIG)]
    history = tool_history(turns)
    rendered = paper().render(history)
    texts = outputs(rendered.transcript, history)
    assert texts[0] == f"[step 0]\n{BIG}"
    assert texts[2] == (
        "[step 2]\n[duplicate of step 0: this entire output (20 lines) — restore 0 to see it again]"
    )
    assert rendered.stats.stubs == 1
    tokens = rendered.stats.stub_saved_tokens
    assert tokens > 0 and rendered.stats.fold_saved_tokens == 0


def test_without_the_protocol_stubs_name_the_call_and_nothing_else_is_added() -> None:
    turns = [turn("running", BIG, commands=["pytest -q"]), turn("again", BIG)]
    history = tool_history(turns)
    rendered = ReFold(fold="off").render(history)
    texts = outputs(rendered.transcript, history)
    assert texts == [BIG, "[duplicate of step 0 (`pytest -q`): this entire output (20 lines)]"]
    assert rendered.transcript.tools == history.tools
    assert rendered.stats.overhead_tokens == 0


def test_a_session_refold_cannot_help_renders_exactly_like_base() -> None:
    """No duplicates and a model that ignores the asks: after two ignored asks (each shown
    once, at the end of the prompt) the rendering is the history itself."""
    history = tool_history([turn("working", f"out {i}") for i in range(4)])
    rendered = ReFold().render(history)
    assert rendered.transcript == history
    assert rendered.stats.overhead_tokens == 0
    assert ReFold(fold="off").render(history).transcript == history


def test_dedup_off_keeps_duplicates() -> None:
    history = tool_history([turn(OK, BIG)] * 6)
    rendered = ReFold(dedup=False).render(history)
    assert outputs(rendered.transcript, history)[1] == f"[step 1]\n{BIG}"
    assert rendered.stats.stubs == 0


def test_file_range_stub_uses_the_path_of_the_call() -> None:
    view = numbered(1, source_lines(12))
    turns = [
        turn(OK, view, commands=["cat -n src/app.py"]),
        turn(OK, "edit done"),
        turn(OK, "tests:\n" + view, commands=["cat -n src/app.py"]),
        *plain_turns(3),
    ]
    history = tool_history(turns)
    texts = outputs(paper().render(history).transcript, history)
    assert texts[2] == (
        "[step 2]\ntests:\n[duplicate of step 0: src/app.py lines 1-12 — restore 0 to see it again]"
    )


@pytest.mark.parametrize("build", [tool_history, text_history])
def test_overlapping_file_windows_are_stubbed(build) -> None:
    code = source_lines(80)

    def sed(first: int, last: int) -> Turn:
        view = "\n".join(code[first - 1 : last])
        return turn(OK, view, commands=[f"sed -n '{first},{last}p' src/app.py"])

    history = build([sed(1, 40), sed(21, 60)])
    texts = outputs(paper().render(history).transcript, history)
    assert texts[0] == "[step 0]\n" + "\n".join(code[:40])
    assert texts[1] == (
        "[step 1]\n[lines 1-20: same as step 0 lines 21-40 (src/app.py lines "
        "21-40) — restore 1 to see them]\n" + "\n".join(code[40:60])
    )


def stale_history(stale_by_reply: list[str], k: int = 3) -> Transcript:
    """Step i's output follows reply i; reply i+1 carries PROGRESS p{i} and a STALE line."""
    turns = [turn(protocol("start", "-"), out(0))]
    for i, stale in enumerate(stale_by_reply):
        turns.append(turn(protocol(f"p{i}", stale), out(i + 1)))
    return tool_history(turns)


def test_stale_steps_fold_into_one_note_with_pointers() -> None:
    # replies made with 3..5 steps may mark 0-2 stale; B reaches 3 at t=6
    history = stale_history(["-", "-", "0-2", "-", "-"])
    rendered = paper().render(history, PRESSED)
    texts = outputs(rendered.transcript, history)
    assert texts[0] == "[step 0]\nsteps 0-2 folded: p0 · p1 · p2 — restore 0-2 to see them again"
    assert texts[1] == "[step 1]\nfolded, see the note at step 0"
    assert texts[2] == "[step 2]\nfolded, see the note at step 0"
    assert texts[3] == f"[step 3]\n{out(3)}"
    assert rendered.stats.folded_steps == 3
    assert rendered.stats.rewrites == 1 and rendered.stats.fold_saved_tokens > 0


def test_a_fold_counts_the_re_prefill_from_its_first_changed_output() -> None:
    """Everything from the first folded output up to the output that moved the boundary is
    prefilled again, as the new rendering shows it (the folded text, not the old one)."""
    history = stale_history(["-", "-", "0-2", "-", "-"])  # B reaches 3 with step 5
    rendered = paper().render(history, PRESSED)
    steps = step_indices(history)
    head = len(rendered.transcript.messages) - len(history.messages)
    again = rendered.transcript.messages[head + steps[0] : head + steps[5]]
    assert rendered.stats.rewrites == 1
    assert rendered.stats.reprefill_tokens == sum(estimate_tokens(m) for m in again)


def test_a_fold_waits_until_it_pays() -> None:
    """With KV to spare a removed token is worth a tenth of a prefilled one: folding a few
    steps early in a long context is declined, and taken once enough requests follow."""
    # every reply marks the step three back stale (inside the window it may name)
    stale = ["-", "-"] + [str(i) for i in range(40)]
    history = stale_history(stale[:5])
    rendered = paper().render(history)  # no pressure, 6 requests: not worth it
    assert rendered.stats.folded_steps == 0 and rendered.stats.rewrites == 0
    assert paper().render(history, PRESSED).stats.folded_steps == 3
    longer = stale_history(stale)  # priced again at each boundary move, with more behind
    rendered = paper().render(longer)
    assert 0 < rendered.stats.rewrites < 13  # 13 boundary moves, far fewer rewrites
    assert rendered.stats.folded_steps > 30


def test_stale_marks_outside_the_window_are_ignored() -> None:
    # reply 1 is made with t=2 (no window); reply 3 is made with t=4 (window 0-2): 4 is ignored
    history = stale_history(["0-2", "-", "1, 4", "-", "-"])
    texts = outputs(paper().render(history, PRESSED).transcript, history)
    assert texts[0] == f"[step 0]\n{out(0)}"
    assert texts[1] == "[step 1]\nstep 1 folded: p1 — restore 1 to see it again"
    assert texts[2] == f"[step 2]\n{out(2)}"


def test_fold_runs_merge_across_a_chunk_edge_and_separate_at_gaps() -> None:
    #      t at reply:   1    2    3     4    5    6     7    8    9
    history = stale_history(["-", "-", "0,2", "-", "-", "3-4", "-", "-"])
    texts = outputs(paper().render(history, PRESSED).transcript, history)  # t=9, B=6
    assert texts[0] == "[step 0]\nstep 0 folded: p0 — restore 0 to see it again"
    assert texts[1] == f"[step 1]\n{out(1)}"
    assert texts[2] == "[step 2]\nsteps 2-4 folded: p2 · p3 · p4 — restore 2-4 to see them again"
    assert texts[3] == "[step 3]\nfolded, see the note at step 2"
    assert texts[4] == "[step 4]\nfolded, see the note at step 2"
    assert texts[5] == f"[step 5]\n{out(5)}"


def test_fold_runs_names_each_run_holding_a_step_once_in_order() -> None:
    folded = {0, 1, 2, 5, 7, 8}
    assert fold_runs(folded, [1, 2, 7]) == [(0, 2), (7, 8)]
    assert fold_runs(folded, [5, 8]) == [(5, 5), (7, 8)]
    assert fold_runs(folded, []) == []


def test_fold_off_ignores_stale_lines_and_adds_no_instruction() -> None:
    history = stale_history(["-", "-", "0-2", "-", "-"])
    rendered = ReFold(fold=False).render(history, PRESSED)
    assert outputs(rendered.transcript, history)[0] == out(0)
    assert rendered.transcript.messages[0] == history.messages[0]
    assert rendered.stats.folded_steps == 0


def test_the_restore_tool_comes_with_the_first_fold() -> None:
    tool = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    history = replace(stale_history(["-", "-", "0-2", "-"]), tools=(tool,))  # t=5: B=0
    assert ReFold().render(history, PRESSED).transcript.tools == (tool,)
    longer = replace(stale_history(["-", "-", "0-2", "-", "-"]), tools=(tool,))  # t=6: B=3
    rendered = ReFold().render(longer, PRESSED)
    assert [t["function"]["name"] for t in rendered.transcript.tools] == ["bash", "restore"]
    assert paper().render(history).transcript.tools[-1]["function"]["name"] == "restore"


def test_folding_keeps_every_call_and_assistant_message() -> None:
    turns = [turn(protocol("a"), out(0), out(1)), turn(protocol("b", "0-1"), out(2), out(3))]
    turns += [turn(protocol("c", "2-3"), out(i)) for i in range(4, 9)]
    history = tool_history(turns)
    rendered = paper(k=2).render(history, PRESSED)
    assert rendered.stats.folded_steps == 4
    for original, shown in zip(history.messages[1:], rendered.transcript.messages[1:], strict=True):
        assert shown.role == original.role and shown.tool_call_id == original.tool_call_id
        if original.role == "assistant":
            assert shown is original


def test_parallel_outputs_share_the_progress_of_the_reply_after_them() -> None:
    turns = [turn(protocol("s"), out(0), out(1), out(2))]
    turns += [turn(protocol("read three files", "0-2"), out(3))]
    turns += [turn(OK, out(i)) for i in range(4, 7)]
    history = tool_history(turns)
    texts = outputs(paper().render(history, PRESSED).transcript, history)
    assert texts[0] == (
        "[step 0]\nsteps 0-2 folded: read three files — restore 0-2 to see them again"
    )


def test_system_prompt_gets_the_protocol_instruction_in_the_paper_setting() -> None:
    history = tool_history(plain_turns(1))
    system = paper().render(history).transcript.messages[0]
    assert system.role == "system"
    assert system.parts[0] == history.messages[0].parts[0]
    assert system.text.endswith(FOLD_INSTRUCTION)
    bare = tool_history(plain_turns(1), system=None)
    rendered = paper().render(bare).transcript
    assert rendered.messages[0] == text_message("system", FOLD_INSTRUCTION)
    assert rendered.messages[1:] == bare.messages[:1] + rendered.messages[2:]
    assert ReFold().render(history).transcript.messages[0] == history.messages[0]


def test_reminders_escalate_and_reset_and_show_only_on_the_newest_output() -> None:
    replies = ["no lines", "still none", protocol("ok"), "none again", "none", "none", "none"]
    levels = [1, 2, None, 1, 2, 3, 4]
    turns = [turn(r, f"out {i}") for i, r in enumerate(replies)]
    for n, level in enumerate(levels, start=1):
        history = tool_history(turns[:n])
        rendered = paper(k=10).render(history)
        texts = outputs(rendered.transcript, history)
        assert texts[:-1] == [f"[step {i}]\nout {i}" for i in range(n - 1)]
        newest = f"[step {n - 1}]\nout {n - 1}"
        assert texts[-1] == (newest if level is None else f"{newest}\n\n{reminder_text(level)}")
        assert rendered.stats.reminders == (level is not None)
    assert ReFold(k=10, fold=False).render(history).stats.reminders == 0


def test_an_ask_leaves_the_rendering_when_ignored_and_stays_when_followed() -> None:
    ignored = [turn("no lines", "out 0"), turn("no lines", "out 1"), turn("none", "out 2")]
    r = ReFold()
    first = outputs(r.render(tool_history(ignored[:1])).transcript, tool_history(ignored[:1]))
    assert first[0].startswith("out 0\n\n[context protocol: this output is step 0;")
    two = tool_history(ignored[:2])
    texts = outputs(r.render(two).transcript, two)
    assert texts[0] == "out 0" and "[context protocol: this output is step 1;" in texts[1]
    three = tool_history(ignored)  # two asks ignored: never asked again
    assert r.render(three).transcript == three
    followed = [turn("no lines", "out 0"), turn(protocol("read it"), "out 1"), turn(OK, "out 2")]
    history = tool_history(followed)
    texts = outputs(r.render(history).transcript, history)
    assert texts[0].startswith("out 0\n\n[context protocol: this output is step 0;")
    assert texts[1:] == ["[step 1]\nout 1", "[step 2]\nout 2"]  # live: labels from now on


def restore_exchange(history: Transcript, reply: Message) -> tuple[Transcript, RenderState]:
    call = ToolCall("call_r", "restore", '{"steps": "0"}')
    messages = (
        *history.messages,
        replace(reply, parts=(*reply.parts, call)),
        tool_message("call_r", "[restored step 0]\n" + history.messages[3].text),
    )
    return Transcript(messages), RenderState(restored=frozenset({len(messages) - 1}))


def test_restored_messages_render_verbatim_and_are_not_steps_nor_misses() -> None:
    history = tool_history([turn(protocol("a"), BIG)] * 7)
    extended, state = restore_exchange(history, Message("assistant", (Text("need it"),)))
    extended = Transcript(
        extended.messages + tool_history([turn(OK, BIG)], system=None).messages[1:]
    )
    rendered = paper().render(extended, state)
    restored_at = max(state.restored)
    assert rendered.transcript.messages[restored_at] == extended.messages[restored_at]
    assert rendered.stats.steps == 8
    # the restore-only reply does not count as a reply without the protocol lines
    assert rendered.stats.reminders == 0


def test_pinned_steps_render_in_full() -> None:
    history = tool_history([turn(protocol("a", "0-2"), out(i)) for i in range(7)])
    state = RenderState(pinned=frozenset({1}), pressure=1.0)
    texts = outputs(paper().render(history, state).transcript, history)
    assert texts[1] == f"[step 1]\n{out(1)}"
    assert "folded" in texts[0] and "folded" in texts[2]


def test_text_action_transcripts_fold_and_dedup() -> None:
    turns = [turn(protocol("look", "-"), out(0))]
    turns += [
        turn(protocol(f"p{i}", "0-1" if i == 2 else "-"), out(1) if i == 0 else BIG)
        for i in range(8)
    ]
    history = text_history(turns)
    rendered = paper().render(history, PRESSED)
    texts = outputs(rendered.transcript, history)
    assert texts[0] == "[step 0]\nsteps 0-1 folded: p0 · p1 — restore 0-1 to see them again"
    # the first copy stays shown while a stub names it
    assert texts[2] == f"[step 2]\n{BIG}"
    assert texts[3] == (
        "[step 3]\n[duplicate of step 2: this entire output (20 lines) — restore 2 to see it again]"
    )
    assert rendered.transcript.messages[2] is history.messages[2]  # the action, unchanged


def test_cache_gives_the_same_rendering_as_no_cache() -> None:
    history = stale_history(["-", "-", "0-2", "-", "1", "3-5", "-", "-", "-", "7"])
    r = ReFold()
    cache = None
    for end in range(1, len(history.messages) + 1):
        part = history.with_messages(history.messages[:end])
        warm = r.render(part, None, cache)
        cache = warm.cache
        assert warm.transcript == r.render(part).transcript
        assert warm.stats == r.render(part).stats


def test_a_cache_from_another_branch_or_setting_is_ignored() -> None:
    r = ReFold()
    a = tool_history([turn(OK, BIG), *plain_turns(8)])
    b = tool_history([turn(OK, "different"), *plain_turns(8)])
    cache = r.render(a).cache
    assert isinstance(cache, ReFoldCache)
    assert r.render(b, None, cache).transcript == r.render(b).transcript
    longer_b = tool_history([turn(OK, "different"), *plain_turns(9)])
    assert r.render(longer_b, None, cache).transcript == r.render(longer_b).transcript
    other = ReFold(dedup=False)
    assert other.render(a, None, cache).transcript == other.render(a).transcript
    pinned = RenderState(pinned=frozenset({0}))
    assert r.render(a, pinned, cache).transcript == r.render(a, pinned).transcript
    assert r.render(a, None, "garbage").transcript == r.render(a).transcript


def test_a_cache_survives_a_text_transcript_turning_into_a_tool_transcript() -> None:
    r = ReFold()
    text = text_history(plain_turns(7))
    cache = r.render(text).cache
    mixed = Transcript(
        (
            *text.messages,
            Message("assistant", (ToolCall("c", "bash", "{}"),)),
            tool_message("c", "x"),
        )
    )
    assert r.render(mixed, None, cache).transcript == r.render(mixed).transcript


def test_a_warm_render_reuses_the_cached_prefix_messages() -> None:
    r = ReFold()
    history = tool_history([turn(OK, f"{BIG}\nrun {i}") for i in range(10)])  # B=6
    first = r.render(history)
    grown = tool_history([turn(OK, f"{BIG}\nrun {i}") for i in range(11)])  # B still 6
    second = r.render(grown, None, first.cache)
    prefix_end = step_indices(history)[6]
    head = len(first.transcript.messages) - len(history.messages)
    for i in range(head + prefix_end):
        assert second.transcript.messages[i] is first.transcript.messages[i]


def test_a_cache_built_without_a_restore_is_ignored_once_the_restore_is_listed() -> None:
    r = ReFold()
    history, state = restore_exchange(tool_history([turn(OK, BIG)] * 7), Message("assistant", ()))
    cache = r.render(history).cache  # the restored turn was taken for a step
    assert r.render(history, state, cache).transcript == r.render(history, state).transcript
    assert r.render(history, state, cache).stats.steps == 7


def test_progress_comes_from_the_first_reply_after_the_step_that_has_one() -> None:
    # a restore-only reply without the lines comes between step 0 and the real reply
    history = tool_history([turn(protocol("start"), "output 0")])
    history, state = restore_exchange(history, Message("assistant", (Text("need step 0"),)))
    rest = [turn(protocol("found it"), "output 1"), turn(OK, "output 2")]
    rest += [turn(protocol("p", "0"), "output 3"), *plain_turns(3)]
    history = Transcript(history.messages + tool_history(rest, system=None).messages[1:])
    state = replace(state, pressure=1.0)
    history = Transcript(
        tuple(
            m.with_text(out(0)) if m.role == "tool" and m.text == "output 0" else m
            for m in history.messages
        )
    )
    texts = outputs(paper().render(history, state).transcript, history, state)
    assert texts[0] == "[step 0]\nstep 0 folded: found it — restore 0 to see it again"
