"""The text scans on the request path take time linear in their input.

A regex with ambiguous adjacent quantifiers retries from every position of a long run (a
line of ``/`` in a tool output, of spaces in a reply): quadratic, on the event loop. The
check is machine-independent: the same number of characters, cut into pieces 4x longer,
must cost about the same (linear) and not 4x (quadratic); the best of a few rounds, so
that a loaded machine's pauses do not count. Then one piece of 200,000 characters must
take well under a second (it took minutes before).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gateway.fold.calls import describe_producer, path_from_command
from gateway.fold.json_output import unwrap
from gateway.fold.protocol import parse_reply
from gateway.fold.references import anchors, said
from gateway.fold.spans import split_spans
from gateway.resent_body import wide_integer
from gateway.steps.reply_filter import text_restore
from gateway.transcript import text_message

_CAT_N = "Here's the result of running `cat -n` on x"
_EDITED_HEADER = "Here's the result of running `cat -n` on edited file:\n"

# name -> (pathological text of about n characters, the scan it goes through)
SHAPES: dict[str, tuple[Callable[[int], str], Callable[[str], object]]] = {
    "slash line in a tool output": (lambda n: "/" * n, split_spans),
    "space line in a reply": (lambda n: " " * n + "x", parse_reply),
    "spaces inside a PROGRESS value": (lambda n: "PROGRESS: a" + " " * n + "b", parse_reply),
    "cat with a long -n flag": (lambda n: "cat -" + "n" * n + "!", path_from_command),
    "unclosed backtick run": (lambda n: "`" * n + "\nx", describe_producer),
    "cat -n header repeated on a line": (lambda n: _CAT_N * (n // len(_CAT_N)), split_spans),
    "edited-file headers": (
        lambda n: "The file a.py has been edited\n" + _EDITED_HEADER * (n // len(_EDITED_HEADER)),
        split_spans,
    ),
    "blank lines before a restore block": (lambda n: "\n" * n + "x", text_restore),
    "blanks in a restore block": (lambda n: "```" + " " * n + "x", text_restore),
    "slash word among an output's paths": (lambda n: "/" * n, anchors),
    "dotted path word": (lambda n: "a/" + "a." * (n // 2), anchors),
    "quotes and backticks in a reply": (
        lambda n: '`"' * (n // 2),
        lambda text: said(text_message("assistant", text)),
    ),
    "a Codex output of escapes": (lambda n: '{"output": "' + "\\n" * (n // 2) + '"}', unwrap),
    # A body scanned for integers orjson would read as floats: a 19-digit run in a string
    # of escapes, after numbers of every length.
    "19 digits among escapes and numbers": (
        lambda n: (
            '{"a": "'
            + '\\"' * (n // 4)
            + '1234567890123456789", "b": ['
            + ",".join(["-1.5e+7", "123456789012345678", "9" * 19] * (n // 200 + 1))
            + "]}"
        ),
        lambda text: wide_integer(text.encode()),
    ),
}

TOTAL = 16_000  # characters per timing; pieces of SHORT and 4 * SHORT characters
SHORT = 250


def _seconds(make: Callable[[int], str], scan: Callable[[str], object], piece: int) -> float:
    """The best of three rounds of scanning TOTAL characters in pieces of ``piece``."""
    texts = [make(piece) for _ in range(TOTAL // piece)]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for text in texts:
            scan(text)
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("shape", list(SHAPES))
def test_scan_is_linear_in_the_run(shape):
    make, scan = SHAPES[shape]
    short, long = _seconds(make, scan, SHORT), _seconds(make, scan, 4 * SHORT)
    # Linear: about 1 (fewer calls for the longer pieces); quadratic: 4, cubic: 16.
    assert long < 2.5 * short + 0.002, f"{shape}: {long:.4f} s vs {short:.4f} s"
    started = time.perf_counter()
    scan(make(200_000))
    assert time.perf_counter() - started < 1.0, f"{shape}: 200,000 characters"
