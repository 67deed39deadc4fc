"""Tracing a rendering back to the history: which message each rendered one shows, and
what the strategy did to it."""

from __future__ import annotations

import json

from gateway.accounting import parse
from gateway.fold import make_renderer
from gateway.session_view import align, trace
from gateway.transcript import text_message
from tests.fold.conftest import protocol, source_lines, tool_history, turn

FILE = "\n".join(source_lines(30))


def session(steps: int = 9):
    """Step 1 re-reads step 0's file; the reply after step 2 marks step 2 stale."""
    outputs = [FILE, FILE] + [
        f"output {i}\n" + "\n".join(source_lines(20, f"t{i}")) for i in range(2, steps)
    ]
    return tool_history(
        [turn(protocol(f"p{i}", "2" if i == 3 else "-"), out) for i, out in enumerate(outputs)]
    )


def test_refold_marks_the_stub_and_the_fold_it_made():
    history = session()
    rendered, sources, kinds = trace(make_renderer("refold"), history, None)
    assert len(rendered.transcript.messages) == len(history.messages)  # has a system prompt
    assert sources == list(range(len(history.messages)))
    steps = [i for i, m in enumerate(history.messages) if m.role == "tool"]
    assert kinds[steps[1]] == "stub" and kinds[steps[2]] == "fold"
    assert kinds.count("stub") == rendered.stats.stubs
    assert kinds.count("fold") == rendered.stats.folded_steps
    assert kinds[0] == "labelled"  # the protocol joins the system prompt
    assert {kinds[i] for i in steps[3:]} == {"labelled"}


def test_refold_without_a_system_prompt_adds_one():
    history = session().with_messages(session().messages[1:])
    _, sources, kinds = trace(make_renderer("refold"), history, None)
    assert (sources[0], kinds[0]) == (None, "added")
    assert sources[1:] == list(range(len(history.messages)))


def test_a_cliff_summary_replaces_the_messages_it_drops():
    history = session(12)
    total = sum(len(m.text) // 4 + 4 for m in history.messages)
    rendered, sources, kinds = trace(make_renderer("cliff", budget=total // 2), history, None)
    out = rendered.transcript.messages
    assert rendered.stats.compactions >= 1
    assert kinds.count("summary") == 1 and sources[kinds.index("summary")] is None
    kept = [s for s in sources if s is not None]
    assert kept == sorted(kept) and len(kept) == len(out) - 1 < len(history.messages)
    assert all(out[i] == history.messages[s] for i, s in enumerate(sources) if s is not None)


def test_refold_then_cliff_is_traced_through_both():
    history = session(12)
    total = sum(len(m.text) // 4 + 4 for m in history.messages)
    rendered, sources, kinds = trace(
        make_renderer("refold+cliff", budget=total // 2), history, None
    )
    assert "summary" in kinds
    for m, s, k in zip(rendered.transcript.messages, sources, kinds, strict=True):
        if s is not None:
            assert m.role == history.messages[s].role
            assert k in {"verbatim", "labelled", "stub", "fold"}


def test_mask_and_clip_say_what_they_did():
    history = session(14)  # mask keeps the last 10 outputs
    for spec, kind in (("mask", "masked"), ("clip", "clipped")):
        rendered, _, kinds = trace(make_renderer(spec), history, None)
        assert kinds.count(kind) == rendered.stats.stubs > 0


def test_align_pairs_identical_ends_and_rewrites_in_place():
    a, b, c = (text_message("user", t) for t in "abc")
    assert align([a, b, c], [a, b, c]) == [0, 1, 2]
    summary = text_message("user", "summary of b")
    assert align([a, b, b, c], [a, summary, c]) == [0, None, 3]
    assert align([a, b], [text_message("system", "protocol"), a, b]) == [None, 0, 1]
    assert align([a, b], [a.with_text("[a]"), b]) == [0, 1]


def test_a_state_written_before_the_log_existed_still_reads():
    ledger = parse(json.dumps({"requests": 2, "raw_tokens": 10}).encode())
    assert ledger.totals["requests"] == 2 and ledger.totals["rendered_tokens"] == 0
    assert ledger.log == ()
    assert parse(None).totals["requests"] == 0
