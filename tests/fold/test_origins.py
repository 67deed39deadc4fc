"""Every renderer says where each rendered message came from (``Rendered.sources``/``kinds``)."""

from __future__ import annotations

import pytest

from gateway.fold import make_renderer, parse_spec
from gateway.fold.renderer import keeps_content
from gateway.transcript import Transcript
from tests.fold.conftest import protocol, source_lines, tool_history, turn

FILE = "\n".join(source_lines(30))
BIG = "\n".join(source_lines(300, "big"))
KINDS = {"verbatim", "labelled", "stub", "fold", "summary", "masked", "clipped", "added"}


def session(steps: int = 14) -> Transcript:
    outputs = [FILE, FILE, BIG] + [f"output {i}\n{BIG[:400]}" for i in range(3, steps)]
    return tool_history(
        [turn(protocol(f"p{i}", "2" if i == 3 else "-"), out) for i, out in enumerate(outputs)]
    )


def points(history: Transcript) -> list[Transcript]:
    ends = [i + 1 for i, m in enumerate(history.messages) if m.role == "tool"]
    return [history.with_messages(history.messages[:end]) for end in ends]


@pytest.mark.parametrize(
    ("spec", "options"),
    [
        ("base", {}),
        ("mask", {"keep_last": 2}),
        ("clip", {}),
        ("refold", {}),
        ("refold", {"fold": "on"}),
        ("cliff", {"budget": 2_000}),
        ("refold+cliff", {"budget": 2_000}),
        ("mask+cliff", {"budget": 2_000}),
    ],
)
def test_sources_and_kinds_describe_each_rendered_message(spec: str, options: dict) -> None:
    renderer = make_renderer(spec, **options)
    cache = None
    for history in points(session()):
        rendered = renderer.render(history, None, cache)
        cache = rendered.cache
        out = rendered.transcript.messages
        assert len(rendered.sources) == len(rendered.kinds) == len(out)
        assert set(rendered.kinds) <= KINDS
        shown = [s for s in rendered.sources if s is not None]
        assert shown == sorted(set(shown))
        for m, s, kind in zip(out, rendered.sources, rendered.kinds, strict=True):
            if s is None:
                assert kind in {"summary", "added"}
                continue
            original = history.messages[s]
            assert m.role == original.role and m.tool_call_id == original.tool_call_id
            if kind == "verbatim":
                assert m == original
            elif kind == "labelled":
                assert keeps_content(original, m)
    kinds = set(rendered.kinds)
    expected = {"base": "verbatim", "mask": "masked", "clip": "clipped", "cliff": "summary"}
    assert expected.get(parse_spec(spec).outermost, "stub") in kinds
