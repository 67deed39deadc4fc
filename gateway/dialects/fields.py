"""Helpers both dialect codecs share: typed field access with errors naming the JSON path,
and the namespaced ``meta`` hints that make the round trip lossless.

Each dialect keeps its hints under its own key of a ``meta`` dict (``meta["openai"]``,
``meta["anthropic"]``), so an encoder ignores what another dialect left behind and falls
back to a sensible default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

from gateway.dialects.errors import DialectError

DialectName = Literal["openai", "anthropic"]
"""The request vocabularies (params, tools, parts) the codecs convert between; a dialect
with another one decodes into one of these (Responses into chat's)."""
OPENAI: DialectName = "openai"
ANTHROPIC: DialectName = "anthropic"
RESPONSES = "responses"

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


def within_depth(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` arrays/objects deep.

    Level by level rather than recursively: no recursion limit to hit, and a comprehension
    per level costs a fraction of the parse.
    """
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):  # ``level``: the containers one deeper than the levels seen
        if not level:
            return True
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) is dict or type(child) is list
        ]
    return not level


FieldCheck = Callable[[Any, str], None]
INT32_MAX = 2**31 - 1


def integer(low: int, high: int = INT32_MAX) -> FieldCheck:
    """A check for an integer field within ``[low, high]`` (``8.0``, ``"8"``, ``true`` are not)."""

    def check(value: Any, path: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise DialectError(f"expected an integer, got {_type_name(value)}", param=path)
        if not low <= value <= high:
            wanted = f"must be {low}" if low == high else f"must be between {low} and {high}"
            raise DialectError(f"{wanted}, got {value}", param=path)

    return check


def number(low: float, high: float) -> FieldCheck:
    """A check for a number field within ``[low, high]``."""

    def check(value: Any, path: str) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise DialectError(f"expected a number, got {_type_name(value)}", param=path)
        if not (math.isfinite(value) and low <= value <= high):
            raise DialectError(f"must be between {low:g} and {high:g}, got {value!r}", param=path)

    return check


def strings(value: Any, path: str) -> None:
    """A check for a list of strings."""
    for i, item in enumerate(expect_list(value, path)):
        expect_str(item, f"{path}[{i}]")


def string_or_strings(value: Any, path: str) -> None:
    if not isinstance(value, str):
        strings(value, path)


def check_fields(body: Mapping[str, Any], checks: Mapping[str, FieldCheck]) -> None:
    """Type and range checks of the request fields the gateway reads, converts or forwards
    with a meaning; ``null`` stands for absent, as SDK model dumps send it."""
    for key, check in checks.items():
        value = body.get(key)
        if value is not None:
            check(value, key)


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


def take_tools(body: Mapping[str, Any], params: dict[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The body's ``tools``, each checked to be an object, taken out of ``params``; an empty
    list stays in ``params``, to be written back as sent."""
    if "tools" not in body:
        return ()
    listed = expect_list(body["tools"], "tools")
    tools = tuple(expect_object(tool, f"tools[{i}]") for i, tool in enumerate(listed))
    if tools:
        del params["tools"]
    return tools


def hints(meta: Mapping[str, Any], dialect: str) -> Mapping[str, Any]:
    """The hints in ``meta`` of the dialect named ``dialect`` (``Dialect.name``); empty when
    the object came from elsewhere."""
    found = meta.get(dialect)
    return found if isinstance(found, Mapping) else {}


def make_meta(dialect: str, **values: Any) -> dict[str, Any]:
    """A ``meta`` dict holding the given hints under the dialect's name, leaving out the ones
    that are None/empty."""
    kept = {k: v for k, v in values.items() if v is not None and v != {}}
    return {dialect: kept} if kept else {}


def extra_fields(obj: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The fields of ``obj`` a codec does not interpret, kept to be written back as they were."""
    return {k: v for k, v in obj.items() if k not in known}
