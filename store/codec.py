"""Canonical msgpack encoding, content digests and blob extraction for stored messages.

A message is the plain dict form of ``gateway.transcript.Message.to_dict()``; this module
does not need to know its shape. Encoding is canonical (map keys sorted, tuples as lists)
so equal messages always give equal bytes. Every string of ``BLOB_MIN`` UTF-8 bytes or more
is cut out and replaced by an extension value holding its 128-bit digest: the string itself
is stored once per session as a blob, so a file read ten times is kept once. The message
digest is the hash of this packed form, which pins the blob contents through their digests.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

DIGEST_SIZE = 16
BLOB_MIN = 1024
_BLOB_EXT = 1
_RAW, _ZLIB = b"r", b"z"


def digest(data: bytes) -> bytes:
    """The 128-bit content digest used everywhere in the store (xxh3-128)."""
    return xxhash.xxh3_128_digest(data)


def chain(prev: bytes, message_digest: bytes) -> bytes:
    """Chained digest: the value at position i pins the whole history up to i.

    Comparing one chained value answers "is this stored branch a prefix of that request"
    in O(1), however long the history is.
    """
    return xxhash.xxh3_128_digest(prev + message_digest)


@dataclass(frozen=True, slots=True)
class PackedMessage:
    body: bytes
    digest: bytes
    blobs: Mapping[bytes, str]


def pack_message(message: Mapping[str, Any]) -> PackedMessage:
    """Canonically encode one message, cutting long strings out as blobs."""
    if not isinstance(message, Mapping):
        raise TypeError(f"a stored message must be a dict, got {type(message).__name__}")
    blobs: dict[bytes, str] = {}
    body = msgpack.packb(_canonical(message, blobs), use_bin_type=True)
    return PackedMessage(body, digest(body), blobs)


def unpack_message(body: bytes, blob: Callable[[bytes], str]) -> dict[str, Any]:
    """Decode a packed message; ``blob(digest)`` supplies the text of each blob reference."""

    def ext_hook(code: int, data: bytes) -> Any:
        if code != _BLOB_EXT:
            raise ValueError(f"unknown msgpack extension type {code} in a stored message")
        return blob(data)

    return msgpack.unpackb(body, ext_hook=ext_hook, raw=False, strict_map_key=False)


def blob_refs(body: bytes) -> set[bytes]:
    """The blob digests a packed message refers to (so a loader can fetch them in one go)."""
    refs: set[bytes] = set()

    def ext_hook(code: int, data: bytes) -> None:
        refs.add(data)

    msgpack.unpackb(body, ext_hook=ext_hook, raw=False, strict_map_key=False)
    return refs


def encode_blob(text: str) -> bytes:
    """Stored form of a blob: zlib-compressed when that is smaller (tool outputs usually are)."""
    raw = text.encode()
    packed = zlib.compress(raw, 1)
    return _ZLIB + packed if len(packed) < len(raw) else _RAW + raw


def decode_blob(data: bytes) -> str:
    kind, payload = data[:1], data[1:]
    if kind == _ZLIB:
        return zlib.decompress(payload).decode()
    if kind == _RAW:
        return payload.decode()
    raise ValueError(f"corrupt blob: unknown format byte {kind!r}")


def same_value(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are one value in all the gateway keeps of them:
    their types (``==`` equates ``0`` with ``0.0`` and ``1`` with ``True``, which encode,
    store and forward differently) and their key order (a tool call's arguments keep it).
    Identical objects settle at once, so a re-sent prefix costs a call per item."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return len(a) == len(b) and all(
            ka == kb and same_value(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(same_value, a, b))
    return a == b


def same_prefix(new: Sequence[Any], old: Sequence[Any]) -> int:
    """How many leading items of ``new`` are ``same_value`` as ``old``'s. The identical ones
    (a re-sent prefix holds the previous body's objects) are counted in C, without a call
    per item; from the first that is not, each is compared as a value."""
    identical = list(map(operator.is_, new, old))
    try:
        same = identical.index(False)
    except ValueError:
        return len(identical)
    for a, b in zip(new[same:], old[same:], strict=False):
        if not same_value(a, b):
            break
        same += 1
    return same


def pack(obj: Any) -> bytes:
    """Plain msgpack for small store records (gateway-turn envelopes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _canonical(obj: Any, blobs: dict[bytes, str]) -> Any:
    if isinstance(obj, str):
        if len(obj) * 4 < BLOB_MIN:  # cheap pre-check: cannot reach BLOB_MIN bytes
            return obj
        raw = obj.encode()
        if len(raw) < BLOB_MIN:
            return obj
        ref = digest(raw)
        blobs[ref] = obj
        return msgpack.ExtType(_BLOB_EXT, ref)
    if isinstance(obj, Mapping):
        try:
            keys = sorted(obj)
        except TypeError:
            raise TypeError("message maps must have string keys to be stored") from None
        return {k: _canonical(obj[k], blobs) for k in keys}
    if isinstance(obj, list | tuple):
        return [_canonical(v, blobs) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | bytes):
        return obj
    raise TypeError(f"cannot store a value of type {type(obj).__name__} in a message")
