"""Reading a model reply chunk by chunk: what the client may see now, and restore requests.

``ReplyFilter`` is fed the upstream's ``chat.completion.chunk`` dicts and returns the chunks
to pass on at once. Only what could turn out to be a restore is held back: a tool call until
its name is known, and in text-action sessions a fenced command block until it closes.
Everything else streams with no added delay. The finish reason and usage are held until
the reply is decided, since a restore-only reply is answered inside the gateway and the
client's reply goes on with the model's next attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.dialects.chunks import ChunkAccumulator
from gateway.fold.restore import text_restore

_FENCE = "```"


class _HeldText:
    """A text-action reply's content as it streams: how much of it may go to the client,
    the rest held because a restore block could start there.

    Held back: from an open fence on; a closed block that is a restore with only blanks
    after it; a trailing run of backticks (a fence may be arriving split over chunks). The
    state is kept as the text grows, so each chunk costs its own length: the fences are
    searched for in the new characters only (and the two before them), a closed block is
    read once, when it closes, and the held text is joined only when some of it goes out.
    """

    def __init__(self) -> None:
        self._held: list[str] = []  # the text from ``_sent`` on, in pieces
        self._length = 0
        self._sent = 0
        self._fences = 0  # fences in the text: non-overlapping, searched from the left
        self._last = 0  # start of the last fence
        self._before_last = 0  # start of the one before
        self._search_from = 0  # no fence starts between the last's end and here
        self._carry = ""  # the text's last two characters: a fence may start in them
        self._closed_restore = False  # the last closed block is a restore block
        self._blank_after = True  # only blanks after the last fence
        self._trailing_ticks = 0

    def feed(self, piece: str) -> str:
        """Add ``piece`` to the text; the text the client may have now."""
        start = self._length
        self._length += len(piece)
        self._held.append(piece)
        window_start = start - len(self._carry)
        window = self._carry + piece
        self._carry = window[-2:]
        at = max(self._search_from, window_start) - window_start
        found_end = None
        while (found := window.find(_FENCE, at)) >= 0:
            self._fences += 1
            self._before_last, self._last = self._last, window_start + found
            at = found_end = found + len(_FENCE)
            if self._fences % 2 == 0:
                # The held text starts at or before the block: its opening fence held it.
                first = self._before_last - self._sent
                block = self._joined()[first : first + self._last + len(_FENCE) - self._before_last]
                self._closed_restore = text_restore(block) is not None
        if found_end is not None:
            self._search_from = window_start + found_end
            rest = window[found_end:]
            self._blank_after = not rest or rest.isspace()
        elif piece and not piece.isspace():
            self._blank_after = False
        stripped = piece.rstrip("`")
        if stripped:
            self._trailing_ticks = len(piece) - len(stripped)
        else:
            self._trailing_ticks += len(piece)
        if self._fences % 2:
            safe = self._last
        elif self._fences and self._closed_restore and self._blank_after:
            safe = self._before_last
        else:
            safe = self._length - self._trailing_ticks
        if safe <= self._sent:
            return ""
        held = self._joined()
        self._held = [held[safe - self._sent :]]
        released = held[: safe - self._sent]
        self._sent = safe
        return released

    def held(self) -> str:
        """The text not sent yet."""
        return self._joined()

    def _joined(self) -> str:
        if len(self._held) > 1:
            self._held = ["".join(self._held)]
        return self._held[0] if self._held else ""


@dataclass
class Decision:
    """How a finished reply ended."""

    restores: list[str]
    """Step specs ("5", "3-7") the reply asked to restore."""
    restore_calls: list[dict[str, Any]]
    """The restore tool calls themselves (tool-calling sessions)."""
    asked: dict[str, Any]
    """The restore request alone (its calls, or its command block), as an OpenAI assistant
    message: what the gateway records before the restored content."""
    other_calls: int
    """Tool calls meant for the harness."""
    tail: list[dict[str, Any]]
    """Chunks still owed to the client if this reply ends the exchange (finish, usage)."""
    usage: dict[str, Any] | None
    finish_reason: str | None
    """The upstream's own, before any change made for the client."""


class ReplyFilter:
    """``restore_tool``: the name of the restore tool the gateway offered in this request
    (None: none); ``text_restores``: whether a text harness was told it may write
    ``restore N``. Only what the gateway offered is its to answer: a harness's own tool or
    command of that name goes to the harness."""

    def __init__(
        self,
        *,
        text_actions: bool,
        first_attempt: bool = True,
        restore_tool: str | None = None,
        text_restores: bool = False,
    ) -> None:
        self.text_actions = text_actions and text_restores
        self.restore_tool = restore_tool
        self.first_attempt = first_attempt
        self.acc = ChunkAccumulator()
        self._text = _HeldText()
        self._is_restore: dict[int, bool] = {}
        self._client_index: dict[int, int] = {}
        self._held_calls: dict[int, list[dict[str, Any]]] = {}
        self._tail: list[dict[str, Any]] = []
        self._template: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Take one upstream chunk; return the chunks the client may have now."""
        self.acc.feed(chunk)
        if not self._template:
            self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        choices = chunk.get("choices") or []
        if not choices:
            if chunk.get("usage"):
                self._tail.append(chunk)
            return []
        choice = choices[0]
        delta = choice.get("delta") or {}
        out: list[dict[str, Any]] = []
        passthrough = {k: v for k, v in delta.items() if k not in ("content", "tool_calls")}
        if not self.first_attempt:
            passthrough.pop("role", None)
        if isinstance(delta.get("content"), str):
            piece = self._text.feed(delta["content"]) if self.text_actions else delta["content"]
            if piece:
                passthrough["content"] = piece
        if passthrough:
            out.append(self._chunk(passthrough))
        for call_delta in delta.get("tool_calls") or []:
            out.extend(self._feed_call(call_delta))
        if choice.get("finish_reason"):
            self._tail.append(self._chunk({}, finish_reason=choice["finish_reason"]))
        return out

    def finish(self) -> tuple[list[dict[str, Any]], Decision]:
        """End of the upstream reply: release what is left, and decide."""
        reply = self.acc.message()
        calls = reply.get("tool_calls") or []
        restore_calls = [c for c in calls if self._restores(c["function"]["name"])]
        restores = [_call_spec(c) for c in restore_calls]
        out: list[dict[str, Any]] = []
        held = self._text.held()
        action = text_restore(held) if self.text_actions else None
        if action is not None:
            restores.append(action)
        elif held:
            out.append(self._chunk({"content": held}))
        other_calls = len(calls) - len(restore_calls)
        if restores and not other_calls:
            # The harness must not see a finish_reason of tool_calls with no call in it.
            for chunk in self._tail:
                for choice in chunk.get("choices") or ():
                    if choice.get("finish_reason") == "tool_calls":
                        choice["finish_reason"] = "stop"
        asked: dict[str, Any] = {"role": "assistant", "content": held if action else None}
        if restore_calls:
            asked["tool_calls"] = restore_calls
        decision = Decision(
            restores, restore_calls, asked, other_calls, self._tail, self.acc.usage,
            self.acc.finish_reason,
        )  # fmt: skip
        return out, decision

    def _feed_call(self, call_delta: dict[str, Any]) -> list[dict[str, Any]]:
        index = call_delta.get("index", 0)
        if index not in self._is_restore:
            name = self.acc.calls[index]["name"]
            if not name:
                self._held_calls.setdefault(index, []).append(call_delta)
                return []
            self._is_restore[index] = self._restores(name)
            if not self._is_restore[index]:
                self._client_index[index] = len(self._client_index)
            pending = [*self._held_calls.pop(index, []), call_delta]
        else:
            pending = [call_delta]
        if self._is_restore[index]:
            return []
        renumbered = [dict(d, index=self._client_index[index]) for d in pending]
        return [self._chunk({"tool_calls": renumbered})]

    def _restores(self, name: str) -> bool:
        return self.restore_tool is not None and name == self.restore_tool

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        # A shallow copy: the template's values (id, model, ...) are only ever read.
        return {
            **self._template,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }


def _call_spec(call: dict[str, Any]) -> str:
    arguments = call["function"]["arguments"] or "{}"
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):  # a string of 100,000 "[" is valid JSON text
        return arguments
    return str(args.get("steps", "")) if isinstance(args, dict) else str(args)
