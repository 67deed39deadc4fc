"""Tracing a rendering back to the history: which message each rendered one shows, and
what the strategy did to it."""

from __future__ import annotations

from gateway.accounting import RequestRecord
from gateway.fold import make_renderer
from gateway.session_view import trace
from gateway.transcript import Transcript, text_message
from tests.fold.conftest import protocol, source_lines, tool_history, turn

FILE = "\n".join(source_lines(30))
BIG = "\n".join(source_lines(300, "trace"))


def session(steps: int = 9) -> Transcript:
    """Step 1 re-reads step 0's file; step 2 is long and the reply after it marks it stale."""
    outputs = [FILE, FILE, BIG] + [f"output {i}" for i in range(3, steps)]
    return tool_history(
        [turn(protocol(f"p{i}", "2" if i == 3 else "-"), out) for i, out in enumerate(outputs)]
    )


def requests(history: Transcript) -> list[tuple[Transcript, None]]:
    """What a harness sends, request after request: the history up to each tool output."""
    ends = [i + 1 for i, m in enumerate(history.messages) if m.role == "tool"]
    return [(history.with_messages(history.messages[:end]), None) for end in ends]


def traced(spec: str, history: Transcript, **options):
    inputs = requests(history)
    return trace([make_renderer(spec, **options)] * len(inputs), inputs)


def test_refold_marks_the_stub_and_the_fold_it_made():
    history = session()
    t = traced("refold", history)
    assert t.sources == list(range(len(history.messages)))
    steps = [i for i, m in enumerate(history.messages) if m.role == "tool"]
    assert t.kinds[steps[1]] == "stub" and t.kinds[steps[2]] == "fold"
    assert t.kinds.count("stub") == t.rendered.stats.stubs
    assert t.kinds.count("fold") == t.rendered.stats.folded_steps
    assert {t.kinds[i] for i in steps[3:]} == {"labelled"}  # labelled [step N]


def test_a_protocol_prompt_without_a_system_prompt_is_added():
    history = session().with_messages(session().messages[1:])
    t = traced("refold", history, fold="on")
    assert (t.sources[0], t.kinds[0]) == (None, "added")
    assert t.sources[1:] == list(range(len(history.messages)))


def test_a_cliff_summary_replaces_the_messages_it_drops():
    history = session(12)
    total = sum(len(m.text) // 4 + 4 for m in history.messages)
    t = trace([make_renderer("cliff", budget=total // 2)], [(history, None)])
    rendered, sources, kinds = t.rendered, t.sources, t.kinds
    out = rendered.transcript.messages
    assert rendered.stats.compactions >= 1
    assert kinds.count("summary") == 1 and sources[kinds.index("summary")] is None
    kept = [s for s in sources if s is not None]
    assert kept == sorted(kept) and len(kept) == len(out) - 1 < len(history.messages)
    assert all(out[i] == history.messages[s] for i, s in enumerate(sources) if s is not None)


def test_refold_then_cliff_is_traced_through_both():
    history = session(12)
    total = sum(len(m.text) // 4 + 4 for m in history.messages)
    t = traced("refold+cliff", history, budget=total // 10)  # under what ReFold leaves
    rendered, sources, kinds = t.rendered, t.sources, t.kinds
    assert "summary" in kinds
    for m, s, k in zip(rendered.transcript.messages, sources, kinds, strict=True):
        if s is not None:
            assert m.role == history.messages[s].role
            assert k in {"verbatim", "labelled", "stub", "fold"}


def test_mask_and_clip_say_what_they_did():
    history = session(14)  # mask keeps the last 10 outputs
    for spec, kind in (("mask", "masked"), ("clip", "clipped")):
        t = trace([make_renderer(spec)], [(history, None)])
        assert t.kinds.count(kind) == t.rendered.stats.stubs > 0


def test_renderings_say_which_history_message_each_shows():
    a, b, c = (text_message("user", t) for t in "abc")
    history = Transcript((a, b, c))
    t = trace([make_renderer("base")], [(history, None)])
    assert (t.sources, t.kinds) == ([0, 1, 2], ["verbatim"] * 3)
    protocol_prompt = trace([make_renderer("refold", fold="on")], [(history, None)])
    assert protocol_prompt.sources == [None, 0, 1, 2]
    assert protocol_prompt.kinds[0] == "added"


def test_a_record_written_before_its_newer_fields_still_reads():
    older = RequestRecord.from_dict({"messages": 4, "strategy": "refold"})
    assert older.messages == 4 and older.fold == "" and older.tools == () and older.stubs == 0
