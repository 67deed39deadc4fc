"""Per-session memory of the previous request, so that a request costs what is new in it.

Harnesses re-send the whole history every step. ``DecodeCache`` keeps, per session, the
previous request's raw message dicts and what they decoded to (volatile markers already
dropped); a new request's raw messages are compared with them pairwise (C-level dict
``==``) and the unchanged prefix reuses the decoded ``Message`` objects, so only the new
suffix is decoded. The whole-body checks (``decode_envelope``) still run on every request,
and a message's decoding depends only on its raw dict, its index and the call ids issued
before it, all equal for an equal prefix: the transcript is exactly the full decode's.

What the pipeline derives from each message (store dict, token estimate) is kept beside
it. Reusing the same objects request after request turns the renderer's cache check and
the store's digest cache comparison into pointer checks, and lets ``MessageMemo`` keep
the token estimates and upstream encoding of the rendered messages by object identity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from gateway import metrics
from gateway.dialects.base import Dialect
from gateway.dialects.errors import too_large
from gateway.dialects.openai_chat import encode_message
from gateway.dialects.volatile import without_volatile
from gateway.lru import LRU
from gateway.tokens import BYTES_PER_TOKEN, estimate_tokens
from gateway.transcript import Message, Transcript
from store.branches import is_microcompacted
from store.codec import same_prefix

DECODE_CACHE_BYTES = 128 * 1024 * 1024
MAX_MESSAGES = 10_000  # GatewayConfig.max_messages
# What a session's entry keeps alive (``entry_bytes``), measured with tracemalloc over
# histories of long tool outputs and of many short messages, by
# tests/gateway/test_request_cache.py, which fails when the charge drifts. Each message
# costs objects however short its text: its raw dict, the ``Message`` and its parts tuple,
# its store dict, its memo entry and upstream encoding (~1.1 KB); a tool call its
# ``ToolCall``, its raw and encoded call dicts and its issued id (~0.9 KB more). Its text
# 1.2 times: the raw and decoded strings are one object (the decoder keeps the raw
# ``str``); the upstream JSON of the last rendering (``MessageMemo``) adds what the
# strategy left of it.
ENTRY_BYTES = 2048
MESSAGE_BYTES = 1100
TOOL_CALL_BYTES = 900
TEXT_BYTE_FACTOR = 1.2
# The first raw messages (system prompt, task) name a conversation when no id is sent.
_KEY_MESSAGES = 2


class MessageMemo:
    """What the pipeline derives from a rendered message, kept per message object.

    Entries are keyed by ``id`` and hold the message itself, so an id cannot be reused while
    its entry lives. Entries not used during one request are dropped at the start of the
    next (``next_request``): the memo holds about one request's messages.

    ``tokens`` and ``messages_json`` also keep their result for the last messages they were
    given: a session's next rendering usually starts with the same messages (the same
    objects, or equal ones), so only the new ones are estimated and encoded, and the
    upstream body's message list is the last one's JSON with the new messages' appended.
    """

    def __init__(self) -> None:
        self._current: dict[int, _Derived] = {}
        self._previous: dict[int, _Derived] = {}
        self._tokens_of: tuple[tuple[Message, ...], int] = ((), 0)
        self._json_of: tuple[tuple[Message, ...], bytes] = ((), b"[]")

    def next_request(self) -> None:
        self._previous, self._current = self._current, {}

    def _adopt(self, message: Message) -> _Derived:
        """The entry of a message this request has not used yet (the last one may have)."""
        entry = self._previous.pop(id(message), None) or _Derived(message)
        self._current[id(message)] = entry
        return entry

    def tokens(self, messages: Sequence[Message]) -> int:
        """The sum of ``estimate_tokens`` over the messages."""
        messages = tuple(messages)
        last, total = self._tokens_of
        new = _after(last, messages)
        if new is None:
            new, total = messages, 0
        current = self._current
        for m in new:
            entry = current.get(id(m)) or self._adopt(m)
            if entry.tokens is None:
                entry.tokens = estimate_tokens(m)
            total += entry.tokens
        self._tokens_of = (messages, total)
        return total

    def encode(self, message: Message) -> dict[str, Any]:
        """``openai_chat.encode_message(message)``; callers must not edit the dict."""
        entry = self._current.get(id(message)) or self._adopt(message)
        if entry.encoded is None:
            entry.encoded = encode_message(message)
        return entry.encoded

    def messages_json(self, messages: Sequence[Message]) -> bytes:
        """``orjson.dumps([encode(m) for m in messages])``: the same bytes (orjson writes
        a list as its items' JSON joined by commas)."""
        messages = tuple(messages)
        last, json = self._json_of
        new = _after(last, messages)
        if new is None:
            json, new = b"[]", messages
        if new:
            items = b",".join(orjson.dumps(self.encode(m)) for m in new)
            json = b"[" + items + b"]" if json == b"[]" else json[:-1] + b"," + items + b"]"
        self._json_of = (messages, json)
        return json


def _after(last: tuple[Message, ...], messages: tuple[Message, ...]) -> tuple[Message, ...] | None:
    """The messages after ``last`` when ``messages`` starts with it, else None. Tuple
    comparison checks identity first: the same objects compare in C, without ``__eq__``;
    equal messages (which derive the same) pass too."""
    if not last or messages[: len(last)] != last:
        return None
    return messages[len(last) :]


@dataclass(slots=True)
class _Derived:
    message: Message  # keeps the id valid while the entry lives
    tokens: int | None = None
    encoded: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded request: its transcript (volatile markers dropped), each message's
    ``to_dict()`` for the store, their summed ``estimate_tokens``, the session's memo, and
    how many of the store dicts are microcompaction placeholders (``is_microcompacted``:
    counted as they are decoded, so a request without any is told so without a pass over
    its history)."""

    transcript: Transcript
    stored: list[dict[str, Any]]
    tokens: int
    memo: MessageMemo
    placeholders: int
    session: str | None = None
    """The session, when the request names it by continuing a kept reply."""

    @classmethod
    def full(
        cls, transcript: Transcript, memo: MessageMemo | None = None, session: str | None = None
    ) -> Decoded:
        """Computed from scratch for ``transcript``, markers such as ``cache_control`` dropped:
        they move from turn to turn and mean nothing upstream; kept, they would make an
        unchanged message look edited (a fork per request)."""
        messages = tuple(without_volatile(m) for m in transcript.messages)
        tokens = sum(estimate_tokens(m) for m in messages)
        stored = [m.to_dict() for m in messages]
        placeholders = sum(map(is_microcompacted, stored))
        return cls(
            transcript.with_messages(messages),
            stored,
            tokens,
            memo or MessageMemo(),
            placeholders,
            session,
        )


@dataclass(slots=True)
class _Previous:
    """The previous request of a session, as ``DecodeCache`` keeps it: the raw messages and,
    flattened, what they decoded to with each one's store dict and running token total."""

    head: Decoded
    raw: list[Any]
    ends: list[int]  # how many decoded messages raw[:i + 1] gave
    messages: list[Message]
    stored: list[dict[str, Any]]
    running: list[int]
    placeholders: list[int]  # running count of microcompaction placeholders in ``stored``
    issued: set[str]
    memo: MessageMemo


class DecodeCache:
    """Incremental request decoding, per session (an LRU bounded by the text it holds)."""

    def __init__(self, max_bytes: int = DECODE_CACHE_BYTES, max_messages: int = MAX_MESSAGES):
        self._sessions: LRU[_Previous] = LRU(max_bytes, **metrics.cache_callbacks("decode"))
        self.max_messages = max_messages

    def __len__(self) -> int:
        """Sessions kept."""
        return len(self._sessions)

    def decode(
        self, dialect: Dialect, body: Any, ids: Sequence[Any] = (), *, tenant: str
    ) -> Decoded:
        """``body`` decoded as ``dialect.decode`` with ``without_volatile`` on each message
        would decode it, using what the session's previous request decoded.

        ``ids``: what the request says about its session (header, body fields); the first
        raw messages complete the key. A wrong guess only costs a full decode. The key
        starts with the ``tenant``: a hit is faster than a miss, so a cache shared across
        tenants would tell one tenant what another sent. The cache keeps ``body``'s
        message dicts: callers must not edit them afterwards.
        """
        envelope, raw = envelope_within(dialect, body, self.max_messages)
        key = (tenant, dialect.name, *ids, _digest(raw[:_KEY_MESSAGES]))
        previous = self._sessions.get(key)
        memo = previous.memo if previous is not None else MessageMemo()
        lead = tuple(without_volatile(m) for m in envelope.messages)
        if previous is not None and lead == previous.head.transcript.messages:
            head = previous.head  # the same objects: identity checks downstream
        else:
            head = Decoded.full(Transcript(lead), memo)
        same = 0
        if previous is not None:
            # A re-sent body's prefix holds the previous body's objects (``ResentBodies``).
            same = same_prefix(raw, previous.raw)
            kept = previous.ends[same - 1] if same else 0
            ends, running = previous.ends[:same], previous.running[:kept]
            placeholders = previous.placeholders[:kept]
            messages, stored = previous.messages[:kept], previous.stored[:kept]
            if same == len(previous.raw):
                issued = set(previous.issued)
            else:
                issued = {c.id for m in messages for c in m.tool_calls}
        else:
            ends, running, messages, stored, issued = [], [], [], [], set()
            placeholders = []
        total = running[-1] if running else 0
        cleared = placeholders[-1] if placeholders else 0
        for index in range(same, len(raw)):
            for m in dialect.decode_item(raw[index], index, issued):
                m = without_volatile(m)
                messages.append(m)
                stored.append(as_stored := m.to_dict())
                total += estimate_tokens(m)
                running.append(total)
                cleared += is_microcompacted(as_stored)
                placeholders.append(cleared)
            ends.append(len(messages))
        memo.next_request()
        size = entry_bytes(
            len(head.transcript.messages) + len(messages), len(issued), head.tokens + total
        )
        self._sessions.put(
            key,
            _Previous(head, raw, ends, messages, stored, running, placeholders, issued, memo),
            size,
        )
        transcript = envelope.with_messages((*head.transcript.messages, *messages))
        return Decoded(
            transcript,
            head.stored + stored,
            head.tokens + total,
            memo,
            head.placeholders + cleared,
        )


def entry_bytes(messages: int, tool_calls: int, tokens: int) -> int:
    """What the LRU charges for a session's entry: its estimated memory, in bytes, for a
    history of ``messages`` decoded messages holding ``tool_calls`` calls and ``tokens``
    estimated tokens of text (see ``MESSAGE_BYTES``)."""
    text = tokens * BYTES_PER_TOKEN
    return (
        ENTRY_BYTES
        + messages * MESSAGE_BYTES
        + tool_calls * TOOL_CALL_BYTES
        + int(text * TEXT_BYTE_FACTOR)
    )


def _digest(raw: list[Any]) -> str:
    """The roles and texts of the first raw messages: markers such as ``cache_control``
    move between requests and must not change a session's key. A unit that groups several
    items (``{"items": [...]}``, Responses) counts by its items."""
    h = xxhash.xxh3_64()
    for unit in raw:
        grouped = unit.get("items") if isinstance(unit, dict) else None
        for message in grouped if isinstance(grouped, list) else [unit]:
            _digest_message(h, message)
    return h.hexdigest()


def _digest_message(h: xxhash.xxh3_64, message: Any) -> None:
    if isinstance(message, dict):
        h.update(f"\0{message.get('role')}\0".encode("utf-8", "surrogatepass"))
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"text": content}]
        for block in blocks:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                h.update(block["text"].encode("utf-8", "surrogatepass"))


def session_ids(headers: Mapping[str, str], body: Mapping[str, Any], header: str) -> list[Any]:
    """What a request says about its session, for ``DecodeCache.decode``'s key."""
    # The fields ``identity.resolve_session`` reads (Claude Code's session is in metadata).
    fields = ("prompt_cache_key", "metadata")
    return [headers.get(header), *(repr(body.get(k)) for k in fields)]


def envelope_within(dialect: Dialect, body: Any, max_messages: int) -> tuple[Transcript, list[Any]]:
    """``dialect.decode_envelope(body)``, refused (413) past ``max_messages`` items: each
    costs time on the event loop in every later step, so the count bounds a request's."""
    envelope, raw = dialect.decode_envelope(body)
    if len(raw) > max_messages:
        raise too_large(
            f"request holds {len(raw)} conversation items, over the limit of {max_messages} "
            "(max_messages)"
        )
    return envelope, raw


def continued(
    dialect: Dialect,
    body: Any,
    session: str,
    kept: Sequence[Message],
    max_messages: int = MAX_MESSAGES,
) -> Decoded:
    """A request that sends only new items after a kept conversation (``kept``: its
    messages up to and including the reply it continues), decoded whole.

    The request's own leading messages (instructions) take the place of the kept ones when
    it has any; without, the kept ones stay, so that the history only grows.
    """
    envelope, raw = envelope_within(dialect, body, max_messages)
    issued = {c.id for m in kept for c in m.tool_calls}
    new = [m for index, item in enumerate(raw) for m in dialect.decode_item(item, index, issued)]
    lead = 0
    while lead < len(kept) and kept[lead].role == "system":
        lead += 1
    head = envelope.messages or tuple(kept[:lead])
    return Decoded.full(envelope.with_messages((*head, *kept[lead:], *new)), session=session)
