"""Helpers both dialect codecs share: typed field access with errors naming the JSON path,
and the namespaced ``meta`` hints that make the round trip lossless.

Each dialect keeps its hints under its own key of a ``meta`` dict (``meta["openai"]``,
``meta["anthropic"]``), so an encoder ignores what another dialect left behind and falls
back to a sensible default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gateway.dialects.errors import DialectError

DialectName = Literal["openai", "anthropic", "responses"]
OPENAI: DialectName = "openai"
ANTHROPIC: DialectName = "anthropic"
RESPONSES: DialectName = "responses"

# The dialect a Transcript's ``params`` are written in: set by the decoders, removed by the
# encoders, so that encoding into the other dialect knows to convert them.
DIALECT_PARAM = "x-foldgate-dialect"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def expect_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DialectError(f"expected an object, got {_type_name(value)}", param=path)
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise DialectError(f"expected an array, got {_type_name(value)}", param=path)
    return value


def expect_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise DialectError(f"expected a string, got {_type_name(value)}", param=path)
    return value


def expect_bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise DialectError(f"expected a boolean, got {_type_name(value)}", param=path)
    return value


def require(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise DialectError(f"missing required field {key!r}", param=path_join(path, key))
    return obj[key]


def answered_call(
    obj: Mapping[str, Any], key: str, path: str, issued: set[str] | None, calls: str
) -> str:
    """The call id a tool result names under ``key``; with ``issued`` (the call ids made
    before it), one that answers no call is refused: the result would have nothing to
    pair with when rendered."""
    call_id = expect_str(require(obj, key, path), path_join(path, key))
    if issued is not None and call_id not in issued:
        raise DialectError(
            f"{key} {call_id!r} does not answer any earlier {calls}", param=path_join(path, key)
        )
    return call_id


def path_join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def check_request_body(body: Any) -> dict[str, Any]:
    """The checks every request body gets first: an object, no reserved field."""
    if not isinstance(body, dict):
        raise DialectError(f"request body must be a JSON object, got {_type_name(body)}")
    if DIALECT_PARAM in body:
        raise DialectError("reserved field name", param=DIALECT_PARAM)
    return body


def hints(meta: Mapping[str, Any], dialect: DialectName) -> Mapping[str, Any]:
    """This dialect's hints in ``meta`` (empty when the object came from elsewhere)."""
    found = meta.get(dialect)
    return found if isinstance(found, Mapping) else {}


def make_meta(dialect: DialectName, **values: Any) -> dict[str, Any]:
    """A ``meta`` dict holding the given hints, leaving out the ones that are None/empty."""
    kept = {k: v for k, v in values.items() if v is not None and v != {}}
    return {dialect: kept} if kept else {}


def extra_fields(obj: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The fields of ``obj`` a codec does not interpret, kept to be written back as they were."""
    return {k: v for k, v in obj.items() if k not in known}
