"""One request to the gateway's ASGI app in this process, and the checks on its answer.

In-process, a "dropped connection" is what makes a server drop one: the app raising, or
returning without finishing the response, or a response header a server cannot send.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI


@dataclass
class Answer:
    status: int | None
    headers: list[tuple[bytes, bytes]]
    body: bytes
    dropped: str | None  # why the connection would have been dropped, else None


async def post(
    app: FastAPI,
    path: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    cut: int | None = None,
) -> Answer:
    """``body`` POSTed to ``path``; with ``cut``, the client sends that many of its bytes
    (the body not ended) and disconnects."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"fuzz"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    received = False
    finished = asyncio.Event()
    answer = Answer(None, [], b"", None)
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            if cut is not None:
                return {"type": "http.request", "body": body[:cut], "more_body": True}
            return {"type": "http.request", "body": body, "more_body": False}
        if cut is not None:
            return {"type": "http.disconnect"}
        await finished.wait()  # the client stays until the response is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    except Exception as exc:  # any escape is a dropped connection
        answer.dropped = f"app raised {exc!r}"
    finished_ok = finished.is_set()
    finished.set()
    answer.body = b"".join(parts)
    if answer.dropped is None and (answer.status is None or not finished_ok):
        answer.dropped = "response not completed"
    for name, value in answer.headers:
        if any((b < 0x20 and b != 0x09) or b == 0x7F for b in value):
            answer.dropped = f"unsendable header {name!r}: {value!r}"
    return answer


def header(answer: Answer, name: bytes) -> bytes | None:
    return next((v for k, v in answer.headers if k.lower() == name), None)


def error_shape(dialect: str, body: bytes) -> str | None:
    """What is wrong with ``body`` as the dialect's error, or None."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "error body is not JSON"
    if dialect == "anthropic":
        ok = (
            isinstance(payload, dict)
            and payload.get("type") == "error"
            and isinstance(payload.get("error"), dict)
            and isinstance(payload["error"].get("type"), str)
            and isinstance(payload["error"].get("message"), str)
        )
    else:
        err = payload.get("error") if isinstance(payload, dict) else None
        ok = (
            isinstance(err, dict)
            and isinstance(err.get("message"), str)
            and isinstance(err.get("type"), str)
            and "param" in err
            and "code" in err
        )
    return None if ok else f"not the {dialect} error shape"


_LAST_EVENT = {"anthropic": "message_stop", "responses": "response.completed"}


def reply_shape(dialect: str, answer: Answer) -> str | None:
    """What is wrong with a 200 reply (whole or streamed), or None."""
    streamed = (header(answer, b"content-type") or b"").startswith(b"text/event-stream")
    if not streamed:
        try:
            payload = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return "reply is not JSON"
        wanted = {"openai": "chat.completion", "anthropic": "message", "responses": "response"}
        got = payload.get("object", payload.get("type")) if isinstance(payload, dict) else None
        return None if got == wanted[dialect] else f"reply is a {got!r}"
    frames = [f for f in answer.body.split(b"\n\n") if f.strip()]
    if not frames:
        return "empty stream"
    data = []
    for frame in frames:
        lines = [line for line in frame.split(b"\n") if line.startswith(b"data: ")]
        if len(lines) != 1:
            return f"malformed frame {frame[:80]!r}"
        data.append(lines[0][6:])
    if dialect == "openai":
        return None if data[-1] == b"[DONE]" else "stream did not end with [DONE]"
    try:
        last = orjson.loads(data[-1])
    except orjson.JSONDecodeError:
        return "last frame is not JSON"
    return None if last.get("type") == _LAST_EVENT[dialect] else f"stream ended with {last}"
