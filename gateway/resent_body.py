"""A re-sent request body parsed from where the session's previous body ended.

Harnesses re-send their whole history every step, so a body usually begins with the
bytes of the session's previous body up to the end of its last conversation item. Per
session, ``ResentBodies`` keeps where that was (an offset), the xxh3-128 digest of the
bytes before it (the store's digest, ``store.codec``) and what they parsed to, not the
text. A body whose bytes up to that offset digest the same is parsed only after it: the
new items and the fields after them go through orjson and the depth check, framed as
``{"\\u0000":[{}`` + the rest, a document in the very parser state the prefix left (inside
the top object, inside the item array, just after an object: only whitespace, ``,`` or
``]`` may follow either); the prefix's fields and
items are the previous body's objects. A body that does not extend the previous one, or
whose rest does not parse framed so, takes the full path (``parse_object``), which gives
its error; so both paths give equal bodies and the same errors.

orjson tells no offsets: ``_Scan`` walks the bytes of a body orjson already accepted
(valid JSON, so strings, brackets and keys are all it needs to tell apart) to find the
item array's field and the end of its last item, in C-level regex steps per bracket.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from gateway import metrics
from gateway.dialects.errors import DialectError
from gateway.dialects.fields import within_depth
from gateway.lru import LRU

# Deeper JSON than any agent sends (tool schemas nest a few tens of levels): past it a
# body would reach recursion limits downstream (orjson writes at most 254 levels upstream).
MAX_JSON_DEPTH = 128
# A session's later bodies, sent without a session header, share a key with other
# sessions of the tenant: this many of them are tried (a 16-byte check each) per key.
CANDIDATES = 8
# What an entry keeps alive, charged as if it held its objects alone (the decode cache
# charges the same raw messages, and drops them at other times): its digest and offsets;
# the text, and per container (object or array) and per string what its objects cost
# besides it (keys are shared, values not), measured with tracemalloc (many short messages
# keep 5.4x their text alive, long tool outputs 1.04x; tests/gateway/test_lru.py checks it).
ENTRY_BYTES = 512
CONTAINER_BYTES = 112
STRING_BYTES = 24
_CHECK = 16  # bytes before the prefix's end compared before its digest is computed
_FRAME = b'{"\\u0000":[{}'
_PLACEHOLDER = "\x00"
# The frame's key can only be written as this escape: a rest holding it takes the full
# path, so the framed document's first key is the frame's own.
_PLACEHOLDER_ESCAPE = b"\\u0000"


def parse_object(raw: bytes | bytearray) -> dict[str, Any]:
    """The body as a JSON object: 400 for anything but a JSON object nested at most
    ``MAX_JSON_DEPTH`` levels."""
    try:
        # orjson: a 128 KB history parses in half the time of the json module's.
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DialectError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise DialectError("request body must be a JSON object")
    if not within_depth(body, MAX_JSON_DEPTH):
        raise DialectError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    if (literal := wide_integer(raw)) is not None:
        raise DialectError(
            f"request body holds the integer {literal}, beyond the 64-bit range: it would be "
            "read as a float and not be kept exactly; send it as a string"
        )
    return body


def wide_integer(raw: bytes | bytearray) -> str | None:
    """The first integer literal of ``raw`` (JSON orjson accepted, or a run of whole values
    and the punctuation between them) that orjson reads as a float, being outside
    [-2**63, 2**64): its value would be stored and sent upstream changed. None if none;
    the literal is cut to 40 digits."""
    if _RUN_19 not in raw.translate(_DIGITS_AS_ZERO):  # no 19 digits in a row: the usual case
        return None
    pos = 0
    while (pos := _TO_LONG_INTEGER.match(raw, pos).end()) < len(raw):
        end = _DIGITS.match(raw, pos).end()
        sign = -1 if raw[pos - 1] == ord("-") else 1
        # A float literal's digits pass; past 20 digits (JSON has no leading zeros) no
        # integer is in range, and int() would refuse a long enough run.
        if raw[end : end + 1] not in (b".", b"e", b"E") and (
            end - pos > 20 or not -(2**63) <= sign * int(raw[pos:end]) < 2**64
        ):
            return "-" * (sign < 0) + bytes(raw[pos : min(end, pos + 40)]).decode()
        pos = end
    return None


@dataclass(slots=True)
class _Sent:
    """A session's previous body, as far as its last item: ``end`` is the offset just
    after that item's closing brace, ``digest`` the digest of the bytes before it."""

    end: int
    check: bytes
    digest: bytes
    head: dict[str, Any]  # the fields before the item array (the array's own: [])
    field: str
    items: list[Any]
    charge: int


class ResentBodies:
    """Per session key, the previous bodies' prefixes (an LRU bounded by the bytes they
    keep alive). ``parse(raw, key, field)`` equals ``parse_object(raw)``; the objects of an
    unchanged prefix are the previous body's (callers must not edit them). A body of more
    than ``max_items`` items (refused later: ``max_messages``) is not kept: finding its
    offsets would cost time on the event loop for nothing."""

    def __init__(self, max_bytes: int, max_items: int) -> None:
        self.max_items = max_items
        self._slots: LRU[list[_Sent]] = LRU(max_bytes, **metrics.cache_callbacks("bodies"))

    def __len__(self) -> int:
        """Session keys kept."""
        return len(self._slots)

    def __contains__(self, key: Hashable) -> bool:
        """Whether a previous body's prefix is kept under ``key`` (without using it)."""
        return key in self._slots

    def parse(self, raw: bytes | bytearray, key: Hashable, field: str | None) -> dict[str, Any]:
        """``raw`` parsed as ``parse_object`` parses it. ``key``: the tenant and what the
        request says about its session before its body is read (a cache that makes a reply
        faster must not be shared between tenants); ``field``: the dialect's item array
        (None: no prefix is kept)."""
        if field is None:
            return parse_object(raw)
        slot = self._slots.get(key) or []
        view = memoryview(raw)
        for i, sent in enumerate(slot):
            if sent.field != field or len(raw) <= sent.end:
                continue
            if view[sent.end - _CHECK : sent.end] != sent.check:
                continue
            hasher = xxhash.xxh3_128(view[: sent.end])
            if hasher.digest() != sent.digest:
                continue
            resent = _extend(sent, raw, hasher)
            if resent is None:
                break
            body, after = resent
            del slot[i]
            if after is not None:
                slot.insert(0, after)
            self._keep(key, slot)
            return body
        body = parse_object(raw)
        sent = _first(raw, body, field, self.max_items)
        if sent is not None:
            slot.insert(0, sent)
            del slot[CANDIDATES:]
            self._keep(key, slot)
        return body

    def _keep(self, key: Hashable, slot: list[_Sent]) -> None:
        if slot:
            self._slots.put(key, slot, sum(s.charge for s in slot))
        else:
            self._slots.pop(key)


def _charge(raw: bytes | bytearray, start: int, end: int) -> int:
    """What the objects parsed from ``raw[start:end]`` keep alive: their text (at most the
    bytes it was sent in) and per container and string their overhead (a bracket or
    quote inside a string counts too: on the safe side)."""
    containers = raw.count(b"{", start, end) + raw.count(b"[", start, end)
    strings = raw.count(b'"', start, end) // 2
    return end - start + containers * CONTAINER_BYTES + strings * STRING_BYTES


def _first(
    raw: bytes | bytearray, body: dict[str, Any], field: str, max_items: int
) -> _Sent | None:
    """What to keep of a body parsed whole: None when its item array is not a list of at
    most ``max_items`` whose last item is an object, or its field appears more than once
    (the last one would win)."""
    items = body.get(field)
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    if len(items) > max_items:
        return None
    found = _Scan(raw).field_array(field)
    if found is None:
        return None
    start, end = found
    head = orjson.loads(bytes(raw[:start]) + b"[]}")
    digest = xxhash.xxh3_128_digest(memoryview(raw)[:end])
    check = bytes(raw[end - _CHECK : end])
    return _Sent(end, check, digest, head, field, items, ENTRY_BYTES + _charge(raw, 0, end))


def _extend(
    sent: _Sent, raw: bytes | bytearray, hasher: xxhash.xxh3_128
) -> tuple[dict[str, Any], _Sent | None] | None:
    """The body of ``raw``, which starts with ``sent``'s prefix (``hasher`` has digested
    it), parsed from there on, and what to keep of it; None when the rest must be parsed
    whole (it does not parse framed, names the frame's key or the item array again, or
    holds an integer orjson would not read exactly)."""
    rest = raw[sent.end :]
    if _PLACEHOLDER_ESCAPE in rest or wide_integer(rest) is not None:
        return None
    try:
        framed = orjson.loads(_FRAME + rest)
    except orjson.JSONDecodeError:
        return None
    if sent.field in framed or not within_depth(framed, MAX_JSON_DEPTH):
        return None
    new = framed.pop(_PLACEHOLDER)[1:]
    items = sent.items + new
    body = dict(sent.head)
    body[sent.field] = items
    body.update(framed)
    if not new:
        return body, sent
    if not isinstance(new[-1], dict):
        return body, None  # the next body cannot be framed after a scalar item
    end, _ = _Scan(raw).array_end(sent.end)
    if end is None:
        return body, None
    hasher.update(memoryview(raw)[sent.end : end])
    check = bytes(raw[end - _CHECK : end])
    charge = sent.charge + _charge(raw, sent.end, end)
    after = _Sent(end, check, hasher.digest(), sent.head, sent.field, items, charge)
    return body, after


# Over valid JSON: a string, whitespace, and anything up to the next bracket.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_WS = re.compile(rb"[ \t\r\n]*+")
_TO_BRACKET = re.compile(rb'(?:[^"\[\]{}]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
# A run of objects holding no array or object (plain messages), one C-level step.
_FLAT = rb'\{(?:[^"\[\]{}]++|"(?:[^"\\]++|\\.)*+")*+\}'
_FLAT_RUN = re.compile(_FLAT + rb"(?:[ \t\r\n]*+,[ \t\r\n]*+" + _FLAT + rb")*+", re.DOTALL)
_SCALAR = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[^,}\] \t\r\n]++', re.DOTALL)
_OPEN = frozenset(b"[{")
# orjson reads an integer literal outside [-2**63, 2**64) as a float (``wide_integer``):
# first whether 19 digits stand in a row anywhere (each digit as "0", then a substring
# search: about as long as orjson's parse; a regex took 17 times that), then (rarely) up
# to the next literal that may be one: strings, other text, integers of up to 18 digits,
# positive ones of 19 (below 2**64) and the digits of a fraction or an exponent pass, each
# in one C-level step.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_RUN_19 = b"0" * 19
_DIGITS = re.compile(rb"[0-9]++")
_TO_LONG_INTEGER = re.compile(
    rb'(?:"(?:[^"\\]++|\\.)*+"|[^"0-9]++|(?<=[.eE])[0-9]++|(?<=[eE][+-])[0-9]++'
    rb"|[0-9]{1,18}+(?![0-9])|(?<!-)[0-9]{19}+(?![0-9]))*+",
    re.DOTALL,
)


class _Scan:
    """Offsets in a body orjson accepted (valid JSON)."""

    def __init__(self, raw: bytes | bytearray) -> None:
        self.raw = raw

    def field_array(self, field: str) -> tuple[int, int] | None:
        """Where the top-level ``field``'s array starts (its ``[``) and its last item ends
        (after the ``}``); None unless ``field`` is there exactly once and its last item
        is an object."""
        raw, found = self.raw, None
        pos = _WS.match(raw, 0).end() + 1  # after the top object's "{"
        while True:
            pos = _WS.match(raw, pos).end()
            if raw[pos] == ord("}"):
                return found
            key_end = _STRING.match(raw, pos).end()
            key = raw[pos:key_end]
            name = orjson.loads(key) if b"\\" in key else key[1:-1].decode()
            pos = _WS.match(raw, key_end).end() + 1  # after the ":"
            pos = _WS.match(raw, pos).end()
            if name == field:
                if found is not None or raw[pos] != ord("["):
                    return None
                start = pos
                last, pos = self.array_end(pos + 1)
                if last is None:
                    return None
                found = (start, last)
            else:
                pos = self.value_end(pos)
            pos = _WS.match(raw, pos).end()
            if raw[pos] == ord(","):
                pos += 1

    def value_end(self, pos: int) -> int:
        """The offset after the value starting at ``pos``."""
        raw = self.raw
        if raw[pos] not in _OPEN:
            return _SCALAR.match(raw, pos).end()
        depth = 0
        while True:
            depth += 1 if raw[pos] in _OPEN else -1
            pos += 1
            if depth == 0:
                return pos
            pos = _TO_BRACKET.match(raw, pos).end()

    def array_end(self, pos: int) -> tuple[int | None, int]:
        """Inside an array, from ``pos`` (its start, or just after an item): the offset
        just after its last item when that is an object after ``pos`` (else None), and the
        offset after the array's closing ``]``."""
        raw, depth, last = self.raw, 1, None
        pos = _TO_BRACKET.match(raw, pos).end()
        while True:
            if depth == 1 and (flat := _FLAT_RUN.match(raw, pos)) is not None:
                last = flat.end()
                pos = _TO_BRACKET.match(raw, last).end()
                continue
            char = raw[pos]
            depth += 1 if char in _OPEN else -1
            pos += 1
            if depth == 0:
                break
            if depth == 1 and char == ord("}"):
                last = pos
            pos = _TO_BRACKET.match(raw, pos).end()
        if last is not None and raw[last : pos - 1].strip(b" \t\r\n"):
            last = None  # a scalar or an array after the last object
        return last, pos
