"""Request-scoped markers that are not part of the conversation.

Clients move some fields from request to request: Claude Code puts ``cache_control`` on its
newest blocks, so the block that carried it last turn arrives without it this turn. Kept
in the hints, such a marker makes an unchanged message look edited, and a history that
compares message digests would fork on every request. ``without_volatile`` gives the
message as said, for digesting and storing; encoding it again simply omits the markers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.transcript import Message, Opaque, Part

VOLATILE_FIELDS = frozenset({"cache_control"})
# The hint keys (of any dialect) that hold a dialect object's unknown fields.
_FIELD_HINTS = ("fields", "message_fields", "function_fields")


def _clean_meta(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    out: dict[str, Any] = {}
    for dialect, found in meta.items():
        if not isinstance(found, Mapping):
            out[dialect] = found
            continue
        cleaned = dict(found)
        for key in _FIELD_HINTS:
            if isinstance(found.get(key), Mapping):
                kept = {k: v for k, v in found[key].items() if k not in VOLATILE_FIELDS}
                if kept:
                    cleaned[key] = kept
                else:
                    del cleaned[key]
        if cleaned:
            out[dialect] = cleaned
    return out


def _clean_part(part: Part) -> Part:
    if isinstance(part, Opaque):
        if VOLATILE_FIELDS.isdisjoint(part.data):
            return part
        return Opaque({k: v for k, v in part.data.items() if k not in VOLATILE_FIELDS})
    meta = _clean_meta(part.meta)
    return part if meta == part.meta else replace(part, meta=meta)


def without_volatile(message: Message) -> Message:
    """``message`` without request-scoped markers (``cache_control``) anywhere in it."""
    parts = tuple(_clean_part(p) for p in message.parts)
    meta = _clean_meta(message.meta)
    if parts == message.parts and meta == message.meta:
        return message
    return replace(message, parts=parts, meta=meta)
