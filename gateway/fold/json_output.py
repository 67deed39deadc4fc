"""Tool outputs that arrive JSON-encoded: Codex sends each one as one line,
``{"output": "<the output>", "metadata": {"exit_code": 0, "duration_seconds": 0.4}}``.

Deduplication works on lines, and the whole output is one line here (newlines are ``\\n``
escapes, and the metadata differ every run), so ReFold deduplicates the decoded ``output``
string and puts the result back in its place: everything around the string, and the whole
output when nothing in it was stubbed, keeps its bytes. The history keeps the original
either way, so a restore returns it byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.decoder import scanstring

_DECODER = json.JSONDecoder()
_BLANKS = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Wrapped:
    """An output whose text is a JSON object with an ``output`` string: the string, and
    where its encoding sits in the text (``start``..``end``, quotes included)."""

    text: str
    inner: str
    start: int
    end: int

    def with_inner(self, inner: str) -> str:
        """The text with the ``output`` string replaced by ``inner`` (same bytes around)."""
        if inner == self.inner:
            return self.text
        encoded = json.dumps(inner, ensure_ascii=False)
        return f"{self.text[: self.start]}{encoded}{self.text[self.end :]}"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _BLANKS:
        i += 1
    return i


def unwrap(text: str) -> Wrapped | None:
    """The ``output`` string of a JSON-object output, None for any other text."""
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return None
    found: Wrapped | None = None
    i = _skip(text, i + 1)
    try:
        while i < len(text) and text[i] == '"':
            key, i = scanstring(text, i + 1)
            i = _skip(text, i)
            if not text.startswith(":", i):
                return None
            i = _skip(text, i + 1)
            if key == "output" and text.startswith('"', i) and found is None:
                inner, end = scanstring(text, i + 1)
                found = Wrapped(text, inner, i, end)
                i = end
            else:
                _, i = _DECODER.raw_decode(text, i)
            i = _skip(text, i)
            if text.startswith(",", i):
                i = _skip(text, i + 1)
            elif text.startswith("}", i):
                return found if _skip(text, i + 1) == len(text) else None
            else:
                return None
    except (ValueError, RecursionError):
        return None
    return None
