"""Canonical encoding, digests and blob extraction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import codec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=1500),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=5))
def test_pack_round_trips_and_is_key_order_independent(message: dict) -> None:
    packed = codec.pack_message(message)
    blobs = {ref: codec.decode_blob(codec.encode_blob(t)) for ref, t in packed.blobs.items()}
    assert codec.unpack_message(packed.body, blobs.__getitem__) == message
    assert codec.blob_refs(packed.body) == set(packed.blobs)
    reordered = dict(reversed(list(message.items())))
    assert codec.pack_message(reordered).digest == packed.digest


def test_long_strings_become_blobs_and_pin_the_digest() -> None:
    a = codec.pack_message({"text": "a" * 3000})
    b = codec.pack_message({"text": "a" * 2999 + "b"})
    assert len(a.body) < 40 and list(a.blobs.values()) == ["a" * 3000]
    assert a.digest != b.digest
    assert codec.pack_message({"text": "short"}).blobs == {}


def test_chain_depends_on_order() -> None:
    x, y = codec.digest(b"x"), codec.digest(b"y")
    assert codec.chain(codec.chain(b"", x), y) != codec.chain(codec.chain(b"", y), x)


def test_unstorable_values_are_named() -> None:
    with pytest.raises(TypeError, match="type set"):
        codec.pack_message({"x": {1, 2}})
    with pytest.raises(ValueError, match="unknown format byte"):
        codec.decode_blob(b"?abc")
