"""Per-session memory of the previous request, so that a request costs what is new in it.

Harnesses re-send the whole history every step. ``DecodeCache`` keeps, per session, the
previous request's raw message dicts and what they decoded to (volatile markers already
dropped); a new request's raw messages are compared with them pairwise (C-level dict
``==``) and the unchanged prefix reuses the decoded ``Message`` objects, so only the new
suffix is decoded. The whole-body checks (``decode_envelope``) still run on every request,
and a message's decoding depends only on its raw dict, its index and the call ids issued
before it, all equal for an equal prefix: the transcript is exactly the full decode's.

Reusing the same objects request after request lets the renderer's cache check hit its
identity fast path, and lets ``MessageMemo`` keep what the pipeline derives from each
message (store dict, token estimate, upstream encoding) keyed by object identity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from gateway.dialects.openai_chat import encode_message
from gateway.dialects.volatile import without_volatile
from gateway.fold.renderer import estimate_tokens
from gateway.transcript import Message, Transcript

DECODE_CACHE_SESSIONS = 256
# The first raw messages (system prompt, task) name a conversation when no id is sent.
_KEY_MESSAGES = 2


@dataclass(frozen=True)
class Codec:
    """A client dialect's request decoder, split so that messages decode one at a time."""

    name: str
    envelope: Callable[[Any], tuple[Transcript, list[Any]]]
    item: Callable[[Any, int, set[str]], tuple[Message, ...]]


class MessageMemo:
    """What the pipeline derives from a message, kept per message object.

    Entries are keyed by ``id`` and hold the message itself, so an id cannot be reused while
    its entry lives. Entries not used during one request are dropped at the start of the
    next (``next_request``): the memo holds about one request's messages.
    """

    def __init__(self) -> None:
        self._current: dict[int, _Derived] = {}
        self._previous: dict[int, _Derived] = {}

    def next_request(self) -> None:
        self._previous, self._current = self._current, {}

    def _entry(self, message: Message) -> _Derived:
        key = id(message)
        entry = self._current.get(key)
        if entry is None:
            entry = self._previous.pop(key, None) or _Derived(message)
            self._current[key] = entry
        return entry

    def dicts(self, messages: Iterable[Message]) -> list[dict[str, Any]]:
        """``m.to_dict()`` of each message; callers must not edit the dicts."""
        out = []
        for m in messages:
            entry = self._entry(m)
            if entry.stored is None:
                entry.stored = m.to_dict()
            out.append(entry.stored)
        return out

    def tokens(self, messages: Iterable[Message]) -> int:
        """The sum of ``estimate_tokens`` over the messages."""
        total = 0
        for m in messages:
            entry = self._entry(m)
            if entry.tokens is None:
                entry.tokens = estimate_tokens(m)
            total += entry.tokens
        return total

    def encode(self, message: Message) -> dict[str, Any]:
        """``openai_chat.encode_message(message)``; callers must not edit the dict."""
        entry = self._entry(message)
        if entry.encoded is None:
            entry.encoded = encode_message(message)
        return entry.encoded


@dataclass(slots=True)
class _Derived:
    message: Message  # keeps the id valid while the entry lives
    stored: dict[str, Any] | None = None
    tokens: int | None = None
    encoded: dict[str, Any] | None = None


@dataclass(slots=True)
class _Previous:
    """The previous request of a session, as ``DecodeCache`` keeps it."""

    head: tuple[Message, ...]
    raw: list[Any]
    items: list[tuple[Message, ...]]
    issued: set[str]
    memo: MessageMemo = field(default_factory=MessageMemo)


class DecodeCache:
    """Incremental request decoding, per session (bounded LRU)."""

    def __init__(self, max_sessions: int = DECODE_CACHE_SESSIONS) -> None:
        self._max = max_sessions
        self._sessions: OrderedDict[Hashable, _Previous] = OrderedDict()

    def decode(
        self, codec: Codec, body: Any, ids: Sequence[Any] = ()
    ) -> tuple[Transcript, MessageMemo]:
        """``body`` decoded, volatile markers dropped (as ``without_volatile`` on each
        message of ``codec``'s full decode), and the session's memo.

        ``ids``: what the request says about its session (header, body fields); the first
        raw messages complete the key. A wrong guess only costs a full decode.
        """
        envelope, raw = codec.envelope(body)
        head = tuple(without_volatile(m) for m in envelope.messages)
        key = (codec.name, *ids, _digest(raw[:_KEY_MESSAGES]))
        previous = self._sessions.get(key)
        same = 0
        if previous is not None:
            if head == previous.head:
                head = previous.head  # the same objects: identity checks downstream
            for new, old in zip(raw, previous.raw, strict=False):
                if new != old:
                    break
                same += 1
        items = previous.items[:same] if previous is not None else []
        if previous is not None and same == len(previous.raw):
            issued = set(previous.issued)
        else:
            issued = {c.id for item in items for m in item for c in m.tool_calls}
        for index in range(same, len(raw)):
            items.append(tuple(without_volatile(m) for m in codec.item(raw[index], index, issued)))
        memo = previous.memo if previous is not None else MessageMemo()
        memo.next_request()
        self._sessions[key] = _Previous(head, raw, items, issued, memo)
        self._sessions.move_to_end(key)
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        messages = (*head, *(m for item in items for m in item))
        return envelope.with_messages(messages), memo


def _digest(raw: list[Any]) -> str:
    try:
        return xxhash.xxh3_64_hexdigest(orjson.dumps(raw))
    except TypeError:  # not JSON data (a caller's own objects): no reuse, still correct
        return ""


def session_ids(headers: Mapping[str, str], body: Mapping[str, Any], header: str) -> list[Any]:
    """What a request says about its session, for ``DecodeCache.decode``'s key."""
    return [headers.get(header), *(repr(body.get(k)) for k in ("prompt_cache_key", "user"))]
