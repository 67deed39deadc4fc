"""A re-sent body parsed after the previous body's prefix (``gateway.resent_body``) equals
the full parse: the same body (key order too), the same error, the same decoded transcript
(``DecodeCache`` over the incremental body against ``dialect.decode`` of the full one), for
every dialect, over growing histories written in varied JSON forms and edited in ways
that break the prefix (an earlier item edited, the item field again, the frame's key, a
scalar last item, bytes cut off or appended)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.dialects import DIALECTS
from gateway.dialects.errors import DialectError
from gateway.dialects.volatile import without_volatile
from gateway.request_cache import DecodeCache
from gateway.resent_body import ResentBodies, parse_object
from tests.dialects.strategies import anthropic_bodies, openai_bodies, responses_bodies

BODIES = {
    "openai": openai_bodies(),
    "anthropic": anthropic_bodies(),
    "responses": responses_bodies(),
}
DIALECT = {d.name: d for d in DIALECTS}
EDITS = (
    *("none", "edit earlier", "field again", "frame key", "scalar last", "cut", "append"),
    *("number after", "wide integer after"),
)


def dumps(body: dict[str, Any], form: int) -> bytes:
    """``body`` as JSON in one of the forms clients write."""
    if form == 0:
        return orjson.dumps(body)
    if form == 1:
        return json.dumps(body).encode()  # ", " and ": ", ASCII escapes
    if form == 2:
        return json.dumps(body, indent=1, ensure_ascii=False).encode()
    return json.dumps(dict(reversed(body.items())), separators=(",", ":")).encode()


def edited(raw: bytes, body: dict[str, Any], field: str, edit: str) -> list[bytes]:
    """The bodies to send in turn for ``raw`` under ``edit``."""
    items = body[field]
    if edit == "edit earlier" and len(items) > 1:
        return [orjson.dumps({**body, field: [{"role": "user", "content": "x"}, *items[1:]]})]
    if edit == "field again":
        return [raw[:-1] + b',"' + field.encode() + b'":[{"role":"user","content":"y"}]}']
    if edit == "frame key":
        return [raw[:-1] + b',"\\u0000":1}']
    if edit == "scalar last":
        return [orjson.dumps({**body, field: [*items, 5]})]
    if edit == "cut":
        return [raw[: len(raw) * 2 // 3]]
    if edit == "append":
        return [raw + b" x"]
    if edit == "wide integer after":  # refused by both paths
        return [raw[:-1] + b',"seed":-9223372036854775809}']
    if edit == "number after":
        # The array last, then the same bytes with what would continue a number right
        # after its last item: invalid JSON, however the prefix is framed.
        last = orjson.dumps({**{k: v for k, v in body.items() if k != field}, field: items})
        return [last, last[:-2] + b"e5" + last[-2:], last[:-2] + b".5" + last[-2:]]
    return [raw]


def outcome(parse: Any, raw: bytes) -> Any:
    try:
        body = parse(raw)
    except DialectError as exc:
        return ("error", exc.status, str(exc))
    return ("body", body, list(body))


def decoded(dialect_name: str, cache: DecodeCache | None, body: Any) -> Any:
    dialect = DIALECT[dialect_name]
    try:
        if cache is None:
            whole = dialect.decode(body)
            return whole.with_messages(tuple(without_volatile(m) for m in whole.messages))
        return cache.decode(dialect, body, tenant="t").transcript
    except DialectError as exc:
        return ("error", exc.status, str(exc), exc.param)


@pytest.mark.parametrize("dialect_name", sorted(BODIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_incremental_parse_and_decode_equal_the_full_path(dialect_name: str, data: Any) -> None:
    field = DIALECT[dialect_name].items_field
    assert field is not None
    whole = data.draw(BODIES[dialect_name])
    items = whole[field] if isinstance(whole[field], list) else [whole[field]]
    bodies = ResentBodies(1 << 30, 10_000)
    cache = DecodeCache()
    for n in range(1, len(items) + 1):
        body = {**whole, field: items[:n]}
        form = data.draw(st.integers(0, 3))
        edit = data.draw(st.sampled_from(EDITS))
        for raw in edited(dumps(body, form), body, field, edit):
            incremental = outcome(lambda r: bodies.parse(bytearray(r), ("t",), field), raw)
            full = outcome(parse_object, raw)
            assert incremental == full
            if full[0] == "body":
                assert decoded(dialect_name, cache, incremental[1]) == decoded(
                    dialect_name, None, full[1]
                )


def test_a_growing_history_is_parsed_after_its_prefix() -> None:
    """Plain growth takes the incremental path: the prefix's items are the previous
    body's objects, and per tenant: another tenant's identical body is parsed whole."""
    bodies = ResentBodies(1 << 30, 10_000)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "agent"}]
    previous: list[Any] = []
    for step in range(6):
        messages.append({"role": "user", "content": f'step {step} [{{"}}]'})
        raw = json.dumps({"model": "m", "messages": messages, "stream": True}).encode()
        body = bodies.parse(raw, ("tenant-a", "s"), "messages")
        assert body == orjson.loads(raw)
        assert all(a is b for a, b in zip(body["messages"], previous, strict=False))
        other = bodies.parse(raw, ("tenant-b", "s"), "messages")
        assert other == body and other["messages"][0] is not body["messages"][0]
        previous = body["messages"]


@pytest.mark.parametrize(
    "literal",
    [b"18446744073709551616", b"-9223372036854775809", b"123456789012345678901234567890"],
)
def test_an_integer_orjson_would_read_as_a_float_is_refused_by_both_paths(literal: bytes) -> None:
    """orjson reads an integer outside [-2**63, 2**64) as a float: stored and sent upstream,
    the value would change, so the body is refused, naming it; a kept prefix changes
    nothing (the rest holding it is parsed whole)."""
    bodies = ResentBodies(1 << 30, 10_000)
    first = b'{"model":"m","messages":[{"role":"user","content":"a"}]'
    bodies.parse(first + b"}", ("t", "s"), "messages")
    resent = first[:-1] + b',{"role":"user","content":"b","n":' + literal + b"}]}"
    for parse in (parse_object, lambda raw: bodies.parse(raw, ("t", "s"), "messages")):
        with pytest.raises(DialectError, match=f"integer {literal.decode()}, beyond the 64-bit"):
            parse(resent)


def test_integers_orjson_keeps_exactly_and_digits_elsewhere_pass() -> None:
    raw = (
        b'{"a":18446744073709551615,"b":-9223372036854775808,"c":1733480000000000000,'
        b'"d":"123456789012345678901234567890","e":1.123456789012345678901,'
        b'"f":123456789012345678901.5,"g":1e-12345678901234567890}'
    )
    body = parse_object(raw)
    assert (body["a"], body["b"], body["c"]) == (2**64 - 1, -(2**63), 1733480000000000000)
    assert body["d"] == "123456789012345678901234567890"
