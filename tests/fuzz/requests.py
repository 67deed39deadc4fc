"""Hostile requests for each dialect, made cheaply: a pool of valid bodies drawn once from
the dialect strategies (``tests/dialects/strategies.py``), then, per request, one seeded
mutation of a pooled body: wrong types in the fields the gateway reads, odd session ids
(body or header, UTF-8 among them), vLLM's own request fields, deep nesting at any node,
random nodes replaced or dropped, broken JSON text, odd headers; and, a few percent each,
integers at orjson's 64-bit edges, controls and lone surrogates in strings, byte order
marks, duplicate keys, odd content parts, items out of order, wide arrays and objects,
Content-Encoding claims, bodies cut off by the client's disconnect, a session's history
edited, another tenant under the same session ids, odd API keys. About a tenth go out
unmutated (and still pass the checks as valid requests do). A fifth are a harness's next
step: a session's last body grown by more items, half of them mutated so. Deterministic
for a seed."""

from __future__ import annotations

import gzip
import random
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.steps.decode import MAX_JSON_DEPTH
from tests.dialects.strategies import anthropic_bodies, openai_bodies, responses_bodies


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    strategy: st.SearchStrategy[dict[str, Any]]
    # Fields the gateway reads, with values of the wrong type or out of range.
    typed: dict[str, list[Any]]
    # Where a body may name its session.
    id_fields: tuple[tuple[str, ...], ...]
    # The conversation's item array, which a harness re-sends grown by each step.
    items: str = "messages"


_BAD_BOOL = ["false", "true", 0, 1, [], {}]
_BAD_INT = [-1, 0, "8", 8.5, 1e308, -1e308, True, [], {"n": 1}]
_BAD_NUMBER = ["0.5", -1, 99, 1e308, True, [], {}]
DIALECTS = {
    "openai": Dialect(
        "openai",
        "/v1/chat/completions",
        openai_bodies(),
        {
            "stream": _BAD_BOOL,
            "max_tokens": _BAD_INT,
            "max_completion_tokens": _BAD_INT,
            "n": [2, 0, "1"],
            "temperature": _BAD_NUMBER,
            "top_p": _BAD_NUMBER,
            "stop": [1, [None]],
            "messages": ["hi", {}, [], None],
            "model": [1, None],
            "tools": ["bash", [1]],
            "stream_options": ["yes", 1],
            "top_logprobs": [-1, 21, "5", 1.5, 2**63],
            "logprobs": _BAD_BOOL,
            "seed": [2**63, "1", 1.5],
            "presence_penalty": _BAD_NUMBER,
        },
        (("prompt_cache_key",), ("metadata", "session_id"), ("user",)),
    ),
    "anthropic": Dialect(
        "anthropic",
        "/v1/messages",
        anthropic_bodies(),
        {
            "stream": _BAD_BOOL,
            "max_tokens": [*_BAD_INT, None],
            "temperature": _BAD_NUMBER,
            "top_k": [-1, "5", 1.5],
            "stop_sequences": ["END", [1]],
            "messages": ["hi", {}, [], None],
            "system": [1, [1], [{"type": "image"}]],
            "tool_choice": ["auto", 1],
            "metadata": ["m", []],
        },
        (("metadata", "user_id"), ("metadata", "session_id")),
    ),
    "responses": Dialect(
        "responses",
        "/v1/responses",
        responses_bodies(),
        {
            "stream": _BAD_BOOL,
            "store": _BAD_BOOL,
            "max_output_tokens": _BAD_INT,
            "temperature": _BAD_NUMBER,
            "input": [1, {}, [], None, [1]],
            "instructions": [1, []],
            "tools": ["x", [1]],
            "tool_choice": [1, {"type": "web_search"}],
            "previous_response_id": [1, "resp_unknown", "resp_\x00", "r" * 600, ""],
            "background": [True],
            "top_logprobs": [-1, 21, "5"],
            "max_tool_calls": [0, "2", 1.5],
            "parallel_tool_calls": _BAD_BOOL,
        },
        (("prompt_cache_key",), ("metadata", "session_id")),
        "input",
    ),
}
# Sessions re-sent step by step (``Mutator.grown``), and the items at which one restarts.
GROWING = 8
MAX_GROWN_ITEMS = 24

ODD_IDS = [
    "a\x00b", "a\r\nx-evil: 1", "line\nbreak", "del\x7f", "c1\x85", "tab\tid", "  ",
    "", "café", "セッション", "emoji-🙂", "x" * 300, "y" * 5000, "%00", "../../etc",
    "quote\"'", "a" * 256, "a" * 257, "job/render", "render", "a\u202eb", "nb\u00a0sp",
    "zw\u200bsp", "emoji-👩\u200d💻", "a\u2028b", "\ufeffbom", "pua\ue000", "٣",
]  # fmt: skip
# Header values a real HTTP server lets through (no CR, LF or NUL): latin-1, UTF-8 (of
# good and bad ids) and odd ASCII.
ODD_HEADER_IDS = [
    b"caf\xe9", b"\xff\xfe", b"del\x7f", b"tab\tid", b"x" * 400, b"%", b" ", b"job/render",
    *(text.encode() for text in ("sesión-ü", "セッション", "a\u202eb", "c1\u0085x", "\u3000")),
]  # fmt: skip
# vLLM's own request fields, with values that change the rendering, that mean what
# leaving them out means, and that the gateway drops (``gateway.tenants``).
VLLM_FIELDS: list[tuple[str, Any]] = [
    ("chat_template", "{{ messages }}"), ("request_id", "r-1"), ("request_id", None),
    ("add_generation_prompt", False), ("add_generation_prompt", True),
    ("continue_final_message", True), ("continue_final_message", 0), ("echo", True),
    ("echo", False), ("documents", [{"text": "d"}]), ("add_special_tokens", True),
    ("truncate_prompt_tokens", 5), ("prompt_logprobs", 1), ("return_prompt_text", True),
    ("return_token_ids", False), ("vllm_xargs", {"a": 1}), ("mm_processor_kwargs", {}),
    ("chat_template_kwargs", {"enable_thinking": False}),
    ("chat_template_kwargs", {"messages": []}), ("chat_template_kwargs", {"eos_token": "x"}),
    ("chat_template_kwargs", "x"), ("cache_salt", "mine"), ("session_id", "other"),
    ("priority", -5), ("priority", "1"), ("priority", 2**63), ("priority", 1.5),
    ("kv_transfer_params", {}), ("ec_transfer_params", {}),
    ("top_k", 5), ("min_tokens", 1),
]  # fmt: skip
JUNK: list[Any] = [None, True, -1, 0, 2**40, 1.5, "", "x", [], {}, [None], {"": None}]
# Text that orjson refuses, or takes as something odd, spliced in place of a value.
RAW_JUNK = [b"NaN", b"Infinity", b"-0", b"1e999", b"123456789012345678901234567890", b'"\\ud800"']
LONG = 50_000  # characters of a long run; tens of thousands stalled the loop for minutes
# Characters whose long runs made regexes backtrack: path and line separators, spaces,
# brackets, markup, the text of a word.
RUNS = ["/", " ", "\t", "[", "{", "#", "-", "*", "`", ":", "a", "0", "\\", "é"]
# Integer literals at orjson's edges: past them it reads a float (the value changed).
INTEGER_EDGES = [
    b"-9223372036854775809", b"-9223372036854775808", b"9223372036854775807",
    b"18446744073709551615", b"18446744073709551616", b"-18446744073709551616",
    b"123456789012345678901234567890", b"1" + b"0" * 400,
]  # fmt: skip
# JSON strings holding what text handling chokes on: NUL and C0/C1 controls, a BOM, line
# and paragraph separators, lone surrogates (escaped: orjson refuses them), a raw control
# character (invalid JSON), NUL in a key.
CONTROL_TEXT = [
    b'"a\\u0000b"', b'"\\u0000"', b'"\\u001b[31mred"', b'"c1\\u0085\\u009f"',
    b'"\\ufeffbom"', b'"a\\u2028b\\u2029"', b'"\\ud800"', b'"x\\udfffy"',
    b'"\\ud83d\\ude00"', b'"raw\x01ctl"', b'"raw\x00nul"', b'{"\\u0000k": 1}',
    b'"\\uffff\\ufffe"',
]  # fmt: skip
# Content parts of unknown or mixed types, image parts of every dialect (good and bad),
# text parts without text: some dialects keep them opaque, others refuse them.
ODD_PARTS: list[Any] = [
    {"type": "wat"}, {}, {"type": None}, {"type": "text"}, {"type": "text", "text": 1},
    {"type": "image_url", "image_url": 5}, {"type": "image_url"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}},
    {"type": "image", "source": "x"}, {"type": "image", "source": {"type": "url", "url": 1}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV"}},
    {"type": "input_image"}, {"type": "input_image", "image_url": "https://e.com/a.png"},
    {"type": "input_file", "file_id": "f"}, {"type": "tool_result", "tool_use_id": "x"},
    {"type": "tool_use", "id": "t", "name": "n", "input": {}}, {"type": "thinking"},
    {"type": "refusal", "refusal": "no"}, {"type": "input_audio", "input_audio": None},
    {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}},
    {"type": "input_text", "text": "x"}, {"type": "output_text", "text": "x"},
]  # fmt: skip
# The other tenant's text (``Mutator.other_tenant``): never in the first tenant's sessions
# nor in its upstream requests.
CANARY = "the other tenant's secret"
# API keys a client may get wrong: none, unknown, odd bytes, another scheme.
ODD_KEYS: list[list[tuple[bytes, bytes]]] = [
    [], [(b"authorization", b"Bearer ")], [(b"authorization", b"Bearer nope")],
    [(b"authorization", b"Basic Zm9vOmJhcg==")], [(b"authorization", b"Bearer \xff\xfe")],
    [(b"x-api-key", b"\x80" * 300)], [(b"authorization", b"Bearer " + b"k" * 8000)],
]  # fmt: skip
# Content-Encoding claims (the gateway reads bodies as sent).
ENCODINGS = [b"gzip", b"deflate", b"br", b"identity", b"", b"gzip, identity", b"x-custom"]
STRATEGIES = ["refold", "base", "cliff", "mask", "clip", "refold+cliff", "nope", "", "refold+"]


def pool(dialect: Dialect, size: int) -> list[dict[str, Any]]:
    """``size`` valid bodies from the dialect's strategy (deterministic)."""
    found: list[dict[str, Any]] = []

    @settings(
        max_examples=size,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(dialect.strategy)
    def collect(body: dict[str, Any]) -> None:
        found.append(body)

    collect()
    return found


@dataclass
class Request:
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    kind: str = "valid"
    # Bytes of the body sent before the client disconnects (None: all of it).
    cut: int | None = None
    # Which of the run's two tenants sends it (its API key is added); None: no key but
    # what ``headers`` hold.
    tenant: int | None = 0


class Mutator:
    """One request per call: a pooled body, mutated by one of the mutations below."""

    def __init__(self, dialect: Dialect, bodies: list[dict[str, Any]], seed: int) -> None:
        self.dialect = dialect
        self.bodies = bodies
        self.rng = random.Random(seed)
        self.mutations: list[tuple[float, Callable[[dict[str, Any]], Request]]] = [
            (10, self.valid),
            (14, self.wrong_type),
            (12, self.odd_id),
            (5, self.odd_header),
            (12, self.deep),
            (14, self.replace_node),
            (5, self.drop_node),
            (5, self.broken_text),
            (3, self.odd_params_header),
            (5, self.vllm_field),
            (3, self.long_run),
            (1, self.integer_edge),
            (1, self.control_text),
            (1, self.byte_order_mark),
            (1, self.duplicate_key),
            (1, self.odd_parts),
            (1, self.reordered_items),
            (1, self.wide),
            (1, self.content_encoding),
            (1, self.cut_body),
            (1, self.edited_history),
            (1, self.other_tenant),
            (0.5, self.odd_api_key),
        ]
        self._weights = [w for w, _ in self.mutations]
        self.growing: dict[int, dict[str, Any]] = {}

    def next(self) -> Request:
        body = orjson.loads(orjson.dumps(self.rng.choice(self.bodies)))  # a fresh copy
        if self.rng.random() < 0.2:
            return self.grown(body)
        request = self.mutated(body)
        if self.rng.random() < 0.3:
            strategy = self.rng.choice(STRATEGIES).encode()
            request.headers.append((b"x-foldgate-strategy", strategy))
        if self.rng.random() < 0.1:
            fold = self.rng.choice([b"auto", b"on", b"off", b"sometimes", b""])
            request.headers.append((b"x-foldgate-fold", fold))
        if self.rng.random() < 0.5:
            session = f"fuzz-{self.rng.randrange(40)}".encode()
            request.headers.append((b"x-session-id", session))
        return request

    def mutated(self, body: dict[str, Any]) -> Request:
        (mutate,) = self.rng.choices([m for _, m in self.mutations], self._weights)
        return mutate(body)

    def grown(self, body: dict[str, Any]) -> Request:
        """A harness's next step: one of ``GROWING`` sessions re-sends its last body with
        ``body``'s items after its own (the gateway parses and decodes only those), half the
        time mutated as any other request is (a bad item, field or byte in the prefix or
        the new part)."""
        name, items = self.rng.randrange(GROWING), self.dialect.items
        last = self.growing.get(name)
        new = body.get(items)
        if (
            last is not None
            and isinstance(new, list)
            and isinstance(last.get(items), list)
            and len(last[items]) + len(new) <= MAX_GROWN_ITEMS
        ):
            body = {**last, items: [*last[items], *new]}
        self.growing[name] = body
        copy = orjson.loads(orjson.dumps(body))
        if self.rng.random() < 0.5:
            request = self.mutated(copy)
        else:
            request = Request(orjson.dumps(copy), kind="grown")
        request.headers.append((b"x-session-id", f"grow-{name}".encode()))
        return request

    # --- mutations -------------------------------------------------------------------

    def valid(self, body: dict[str, Any]) -> Request:
        if self.rng.random() < 0.5:
            body["stream"] = self.rng.random() < 0.5
        return Request(orjson.dumps(body))

    def wrong_type(self, body: dict[str, Any]) -> Request:
        name = self.rng.choice(list(self.dialect.typed))
        body[name] = self.rng.choice(self.dialect.typed[name])
        return Request(orjson.dumps(body), kind=f"type:{name}")

    def odd_id(self, body: dict[str, Any]) -> Request:
        path = self.rng.choice(self.dialect.id_fields)
        value = self.rng.choice([*ODD_IDS, self.rng.choice(JUNK)])
        target = body
        for key in path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[path[-1]] = value
        return Request(orjson.dumps(body), kind="id:" + ".".join(path))

    def odd_header(self, body: dict[str, Any]) -> Request:
        headers = [(b"x-session-id", self.rng.choice(ODD_HEADER_IDS))]
        return Request(orjson.dumps(body), headers, kind="id:header")

    def vllm_field(self, body: dict[str, Any]) -> Request:
        for _ in range(self.rng.choice([1, 1, 2, 3])):
            name, value = self.rng.choice(VLLM_FIELDS)
            body[name] = value
        if self.rng.random() < 0.2:  # the params header carries fields too
            name, value = self.rng.choice(VLLM_FIELDS)
            header = orjson.dumps({name: value})
            return Request(orjson.dumps(body), [(b"x-foldgate-params", header)], kind="vllm")
        return Request(orjson.dumps(body), kind="vllm")

    def long_run(self, body: dict[str, Any]) -> Request:
        """A long run of one character (what backtracking regexes choke on) in place of a
        string of the body, or of any value: a message's text, a tool output, call
        arguments, an id, a model name."""
        strings = [(p, k) for p, k in self._nodes(body) if isinstance(p[k], str)]
        parent, key = self.rng.choice(strings) if strings else self._node(body)
        run = self.rng.choice(RUNS) * self.rng.choice([2_000, 20_000, LONG])
        parent[key] = run + self.rng.choice(["", "x", "\n", "]"])
        return Request(orjson.dumps(body), kind="long-run")

    def deep(self, body: dict[str, Any]) -> Request:
        limit = MAX_JSON_DEPTH
        depth = self.rng.choice([limit - 6, limit, limit + 1, 254, 255, 300, 1000, 1023, 5000])
        arrays = [self.rng.random() < 0.5 for _ in range(depth)]
        opens = b"".join(b"[" if array else b'{"k":' for array in arrays)
        closes = b"".join(b"]" if array else b"}" for array in reversed(arrays))
        return self._splice(body, opens + b"1" + closes, kind="deep")

    def replace_node(self, body: dict[str, Any]) -> Request:
        if self.rng.random() < 0.2:
            return self._splice(body, self.rng.choice(RAW_JUNK), kind="replace:raw")
        parent, key = self._node(body)
        parent[key] = self.rng.choice(JUNK)
        return Request(orjson.dumps(body), kind="replace")

    def drop_node(self, body: dict[str, Any]) -> Request:
        parent, key = self._node(body)
        del parent[key]
        return Request(orjson.dumps(body), kind="drop")

    def broken_text(self, body: dict[str, Any]) -> Request:
        raw = bytearray(orjson.dumps(body))
        how = self.rng.randrange(5)
        if how == 0:
            raw = raw[: self.rng.randrange(len(raw))]
        elif how == 1:
            raw[self.rng.randrange(len(raw))] = self.rng.randrange(256)
        elif how == 2:
            raw[self.rng.randrange(len(raw)) :] = b"\xc3\x28" + raw[-1:]
        elif how == 3:
            raw = bytearray(self.rng.choice([b"", b"null", b"[]", b'"x"', b"1", b"{}"]))
        else:
            raw = bytearray(b'{"a":1,' * 3 + raw[1:])  # duplicate-free junk keys first
        return Request(bytes(raw), kind="text")

    def odd_params_header(self, body: dict[str, Any]) -> Request:
        value = self.rng.choice(
            [b"{", b"[]", b'{"stream": "false"}', b'{"max_tokens": -1}', b'{"temperature": 0}',
             b'{"x":' + b"[" * 300 + b"]" * 300 + b"}"]
        )  # fmt: skip
        return Request(orjson.dumps(body), [(b"x-foldgate-params", value)], kind="params-header")

    def integer_edge(self, body: dict[str, Any]) -> Request:
        """An integer literal at or past orjson's 64-bit edges in place of a value, half
        the time a number field the gateway reads."""
        literal = self.rng.choice(INTEGER_EDGES)
        if self.rng.random() < 0.5:
            name = self.rng.choice(list(self.dialect.typed))
            body[name] = "@@splice@@"
            raw = orjson.dumps(body).replace(b'"@@splice@@"', literal, 1)
            return Request(raw, kind="integer-edge")
        return self._splice(body, literal, kind="integer-edge")

    def control_text(self, body: dict[str, Any]) -> Request:
        """NUL, controls, a BOM, separators or lone surrogates in place of one of the
        body's strings (a message's text, an id, a tool output), or of any value."""
        strings = [(p, k) for p, k in self._nodes(body) if isinstance(p[k], str)]
        parent, key = self.rng.choice(strings) if strings else self._node(body)
        parent[key] = "@@splice@@"
        raw = orjson.dumps(body).replace(b'"@@splice@@"', self.rng.choice(CONTROL_TEXT), 1)
        return Request(raw, kind="control-text")

    def byte_order_mark(self, body: dict[str, Any]) -> Request:
        """The body after a UTF-8 byte order mark, or in UTF-16 with its own."""
        raw = orjson.dumps(body)
        if self.rng.random() < 0.5:
            return Request(b"\xef\xbb\xbf" + raw, kind="bom")
        return Request(raw.decode().encode("utf-16"), kind="bom")

    def duplicate_key(self, body: dict[str, Any]) -> Request:
        """A top-level key written twice, the other value first or last (orjson keeps
        the last): the item array, ``stream``, ``model`` or any of the body's."""
        raw = orjson.dumps(body)
        key = self.rng.choice([*body, self.dialect.items, "stream", "model"])
        if key == self.dialect.items and isinstance(body.get(key), list):
            value: Any = body[key][: self.rng.randrange(len(body[key]) + 1)]
        else:
            value = self.rng.choice([*JUNK, True, False, "other"])
        pair = orjson.dumps({key: value})[1:-1]
        if self.rng.random() < 0.5 or raw == b"{}":
            raw = b"{" + pair + (b"," + raw[1:] if raw != b"{}" else b"}")
        else:
            raw = raw[:-1] + b"," + pair + b"}"
        return Request(raw, kind="duplicate-key")

    def odd_parts(self, body: dict[str, Any]) -> Request:
        """A message's content as a list of parts of unknown or mixed types, image parts
        and text parts without text, beside a good text part or not."""
        items = body.get(self.dialect.items)
        messages = [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []
        if not messages:
            return self.replace_node(body)
        parts = self.rng.sample(ODD_PARTS, self.rng.choice([1, 1, 2, 3]))
        if self.rng.random() < 0.5:
            parts.insert(self.rng.randrange(len(parts) + 1), {"type": "text", "text": "ok"})
        self.rng.choice(messages)["content"] = orjson.loads(orjson.dumps(parts))
        return Request(orjson.dumps(body), kind="odd-parts")

    def reordered_items(self, body: dict[str, Any]) -> Request:
        """The item array out of order: shuffled, reversed, or one item moved to the front
        (a tool result before its call, the assistant first, a system turn last)."""
        items = body.get(self.dialect.items)
        if not isinstance(items, list) or len(items) < 2:
            return self.drop_node(body)
        how = self.rng.randrange(3)
        if how == 0:
            self.rng.shuffle(items)
        elif how == 1:
            items.reverse()
        else:
            items.insert(0, items.pop(self.rng.randrange(1, len(items))))
        return Request(orjson.dumps(body), kind="reordered")

    def wide(self, body: dict[str, Any]) -> Request:
        """A value replaced by a wide array or object: hundreds to thousands of items, keys
        or parts (wider costs the run more and finds nothing more: ``test_stall`` sends
        200,000 messages)."""
        count = self.rng.choice([300, 1_000, 3_000])
        how = self.rng.randrange(3)
        if how == 0:
            value: Any = [self.rng.choice(JUNK) for _ in range(count)]
        elif how == 1:
            value = {f"k{i}": i for i in range(count)}
        else:
            value = [{"type": "text", "text": "p"}] * count
        parent, key = self._node(body)
        parent[key] = value
        return Request(orjson.dumps(body), kind="wide")

    def content_encoding(self, body: dict[str, Any]) -> Request:
        """A Content-Encoding claim, the body compressed as claimed or sent plain."""
        encoding = self.rng.choice(ENCODINGS)
        raw = orjson.dumps(body)
        if self.rng.random() < 0.5:
            raw = gzip.compress(raw) if encoding.startswith(b"gzip") else zlib.compress(raw)
        return Request(raw, [(b"content-encoding", encoding)], kind="content-encoding")

    def cut_body(self, body: dict[str, Any]) -> Request:
        """The client disconnects after part of its body (a chunked body cut midway, a
        Content-Length never reached), or after all of it but before saying it ended."""
        raw = orjson.dumps(body)
        return Request(raw, cut=self.rng.randrange(len(raw) + 1), kind="cut")

    def edited_history(self, body: dict[str, Any]) -> Request:
        """A growing session's last body with an earlier item edited, dropped or
        duplicated (a harness's rewrite, an edited prompt): it must fork, never overwrite;
        the session goes on from the edit."""
        name = self.rng.randrange(GROWING)
        last = self.growing.get(name)
        items = last.get(self.dialect.items) if last is not None else None
        if not isinstance(items, list) or not items:
            return self.grown(body)
        items = orjson.loads(orjson.dumps(items))
        at = self.rng.randrange(len(items))
        how = self.rng.randrange(3)
        if how == 0 and isinstance(items[at], dict):
            items[at]["content"] = f"edited {self.rng.randrange(1000)}"
        elif how == 1 and len(items) > 1:
            del items[at]
        else:
            items.insert(at, items[at])
        edited = {**last, self.dialect.items: items}
        self.growing[name] = edited
        headers = [(b"x-session-id", f"grow-{name}".encode())]
        return Request(orjson.dumps(edited), headers, kind="edited-history")

    def other_tenant(self, body: dict[str, Any]) -> Request:
        """The other tenant under a growing session's id, with that session's last body
        (or ``body``) after an item of its own text (``CANARY``): the two sessions share
        an id and most bytes, and must share nothing else."""
        name = self.rng.randrange(GROWING)
        last = self.growing.get(name, body)
        items = last.get(self.dialect.items)
        own = {"role": "user", "content": CANARY}
        if isinstance(items, list):
            last = {**last, self.dialect.items: [own, *items]}
        headers = [(b"x-session-id", f"grow-{name}".encode())]
        return Request(orjson.dumps(last), headers, kind="other-tenant", tenant=1)

    def odd_api_key(self, body: dict[str, Any]) -> Request:
        """No API key, an unknown one, odd bytes, another auth scheme: a 401."""
        headers = list(self.rng.choice(ODD_KEYS))
        return Request(orjson.dumps(body), headers, kind="api-key", tenant=None)

    # --- helpers ---------------------------------------------------------------------

    def _node(self, body: dict[str, Any]) -> tuple[Any, Any]:
        """A random (container, key) of the body, the top level included."""
        return self.rng.choice(self._nodes(body))

    @staticmethod
    def _nodes(body: dict[str, Any]) -> list[tuple[Any, Any]]:
        """Every (container, key) of the body, the top level included."""
        nodes: list[tuple[Any, Any]] = []
        stack: list[Any] = [body]
        while stack:
            node = stack.pop()
            keys = list(node) if isinstance(node, dict) else range(len(node))
            for key in keys:
                nodes.append((node, key))
                if isinstance(node[key], dict | list):
                    stack.append(node[key])
        return nodes

    def _splice(self, body: dict[str, Any], raw: bytes, kind: str) -> Request:
        """The body with ``raw`` JSON text in place of one of its values."""
        marker = "@@splice@@"
        parent, key = self._node(body)
        if isinstance(parent, dict) and self.rng.random() < 0.5:
            parent["x_extra"] = marker
        else:
            parent[key] = marker
        return Request(orjson.dumps(body).replace(f'"{marker}"'.encode(), raw, 1), kind=kind)


# --- pathological shapes ---------------------------------------------------------------
# Valid requests whose cost, in a naive gateway, grows faster than their size: each is
# served or refused with a 4xx while other clients' requests go on (``test_stall.py``).


def _chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages}


def _tool_turn(arguments: str, output: str) -> list[dict[str, Any]]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": arguments},
    }
    return [
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]


def slash_line_in_tool_output() -> Request:
    return Request(orjson.dumps(_chat(_tool_turn('{"command": "ls"}', "/" * LONG))), kind="slashes")


def space_line_in_reply() -> Request:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": " " * LONG + "x"},
        {"role": "user", "content": "go on"},
    ]
    return Request(orjson.dumps(_chat(messages)), kind="spaces")


def many_messages(count: int = 200_000) -> Request:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(count)
    ]
    return Request(orjson.dumps(_chat(messages)), kind="many-messages")


def deep_string_in_arguments() -> Request:
    """Valid JSON text (a string), so the depth check passes; its content nests 100,000 deep."""
    return Request(orjson.dumps(_chat(_tool_turn("[" * 100_000, "ok"))), kind="deep-string")


def deep_string_in_responses_arguments() -> Request:
    items = [
        {"type": "message", "role": "user", "content": "fix the bug"},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "[" * 100_000},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    return Request(orjson.dumps({"model": "m", "input": items}), kind="deep-string")


def long_strategy_header(parts: int = 5_000) -> Request:
    body = _chat([{"role": "user", "content": "hi"}])
    header = (b"x-foldgate-strategy", b"+".join([b"refold", b"cliff"] * (parts // 2)))
    return Request(orjson.dumps(body), [header], kind="long-strategy")


def limit_history(dialect: str, items: int) -> tuple[Request, Request]:
    """A session's history just under ``items`` conversation items (the limit), then the
    same re-sent with the reply and a new user turn, as a harness does, under one session
    id: the re-send holds ``items - 1``, within the limit."""
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
        for i in range(items - 3)
    ]
    resent = [*turns, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "on"}]
    headers = [(b"x-session-id", f"limit-{uuid.uuid4().hex}".encode())]
    bodies = []
    for history in (turns, resent):
        if dialect == "responses":
            body: dict[str, Any] = {"model": "m", "input": history}
        elif dialect == "anthropic":
            body = {"model": "m", "max_tokens": 64, "messages": history}
        else:
            body = _chat(history)
        bodies.append(Request(orjson.dumps(body), headers, kind="limit-history"))
    return bodies[0], bodies[1]


def rewritten(history: Request) -> Request:
    """``history`` with its first message's text changed: a re-send that does not extend
    the previous one (an edited prompt, a harness's own rewrite), under the same session."""
    body = orjson.loads(history.body)
    items = body["input"] if "input" in body else body["messages"]
    items[0] = {**items[0], "content": "an edited first message"}
    return Request(orjson.dumps(body), history.headers, kind="rewritten-history")


# name -> (dialect, request)
PATHOLOGICAL: dict[str, tuple[str, Callable[[], Request]]] = {
    "slash line in a tool output": ("openai", slash_line_in_tool_output),
    "space line in an assistant message": ("openai", space_line_in_reply),
    "200,000 messages": ("openai", many_messages),
    "100,000 [ in tool-call arguments": ("openai", deep_string_in_arguments),
    "100,000 [ in Responses call arguments": ("responses", deep_string_in_responses_arguments),
    "strategy header of 5,000 parts": ("openai", long_strategy_header),
}
