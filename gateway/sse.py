"""Reading server-sent events: the one SSE reader (upstream replies, load tests, calibration).

Each ``data:`` line is one event, named by the ``event:`` line before it if any; blank
separator lines and ``:`` comments carry nothing. That is how vLLM, OpenAI and Anthropic
stream (one data line per event), and it hands an event over as soon as its line is in,
without waiting for the blank line that closes it. Writing events is the dialects' job
(``gateway.dialects.chunks.format_sse``).
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = b"[DONE]"  # OpenAI's last data line


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None  # the ``event:`` name, None for an unnamed event
    data: bytes  # the ``data:`` value, surrounding whitespace removed


class SSEReader:
    """Turns an SSE byte stream into events: ``line`` for one line at a time (a response
    read by lines), ``feed`` for arbitrary chunks of bytes."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._buffer = b""

    def line(self, raw: bytes) -> SSEEvent | None:
        """The event a line completes, or None (a name, a separator, a comment)."""
        line = raw.strip()
        if line.startswith(b"event:"):
            self._event = line[6:].strip().decode("utf-8", errors="replace")
            return None
        if not line.startswith(b"data:"):
            return None
        event, self._event = self._event, None
        return SSEEvent(event, line[5:].strip())

    def feed(self, data: bytes) -> list[SSEEvent]:
        """The events completed by ``data``; a partial last line waits for the next feed."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [event for raw in lines if (event := self.line(raw)) is not None]
