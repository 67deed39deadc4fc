"""No one request stalls the gateway for the others: each pathological shape
(``requests.PATHOLOGICAL``: long runs, a huge message count, a deep string, a long strategy
header) is sent through the gateway's app in this process while another client asks
``/health`` every few milliseconds. The shape is served or refused with a 4xx in the
dialect's shape (never a 5xx), a refusal leaves the store as it was, and the other
client's requests wait at most ``STALL_S`` each (the shapes took 40 s to minutes before)."""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import gateway.app
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.request_cache import DecodeCache, MessageMemo
from gateway.steps.render import Render
from store import open_store
from store.digests import DigestCache
from tests.fuzz.exchange import post
from tests.fuzz.requests import DIALECTS, PATHOLOGICAL, Request, limit_history, rewritten
from tests.fuzz.test_fuzz import fake, judge, sqlite_writes  # noqa: F401 (fixture)

# Generous for a loaded 2-core machine: the refused 200,000 messages still cost a parse.
STALL_S = 2.0


async def health(app: Any) -> int:
    """``GET /health`` through the app; its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/health",
        "raw_path": b"/health",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"fuzz")],
        "client": ("127.0.0.2", 5001),
        "server": ("127.0.0.1", 80),
    }
    done = asyncio.Event()
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    return status[0]


def stall_config(upstream: Any, request: Any, monkeypatch: Any) -> tuple[GatewayConfig, Path]:
    """A gateway over the fake upstream on an SQLite store in a folder of its own."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    folder = Path(tempfile.mkdtemp(prefix="foldgate-stall-", dir=root))
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    config = GatewayConfig(
        store_url=f"sqlite:///{folder}/store.db",
        replicas=(upstream.url,),
        probe_interval_s=3600,
        default_tenant=f"stall-{uuid.uuid4().hex[:8]}",
    )
    monkeypatch.setattr(gateway.app, "open_store", functools.partial(open_store, timeout_s=30))
    return config, folder


async def beside_other_client(app: Any, send: Any) -> tuple[Any, list[float], set[int]]:
    """``send()``'s answer while another client asks ``/health`` every few milliseconds;
    that client's waits and statuses."""
    waits: list[float] = []
    statuses: list[int] = []
    served = asyncio.Event()

    async def other_client() -> None:
        while not served.is_set():
            asked = time.perf_counter()
            statuses.append(await health(app))
            # The wait includes the loop's delay in waking this client at all.
            await asyncio.sleep(0.005)
            waits.append(time.perf_counter() - asked - 0.005)

    prober = asyncio.create_task(other_client())
    await asyncio.sleep(0.05)
    try:
        answer = await send()
    finally:
        served.set()
        await prober
    return answer, waits, set(statuses)


@pytest.mark.fuzz
@pytest.mark.parametrize("shape", list(PATHOLOGICAL))
async def test_shape_beside_other_requests(shape, fake, request, monkeypatch):  # noqa: F811
    config, folder = stall_config(fake, request, monkeypatch)
    dialect_name, make = PATHOLOGICAL[shape]
    big = make()
    app = create_app(config)
    async with app.router.lifespan_context(app):
        writes = sqlite_writes(folder / "store.db")
        await app.state.pipeline.drain()
        before = writes()

        async def send() -> Any:
            answer = await post(app, DIALECTS[dialect_name].path, big.body, big.headers)
            await app.state.pipeline.drain()
            return answer

        answer, waits, statuses = await beside_other_client(app, send)
        wrote = writes() != before
    status = answer.status or 0
    problem = judge(dialect_name, answer)
    assert problem is None, f"{shape}: {problem}: {status} {answer.body[:300]!r}"
    assert status < 300 or 400 <= status < 500
    if status >= 400:
        assert not wrote, f"{shape}: refused ({status}) but the store changed"
    assert statuses == {200}
    assert max(waits) < STALL_S, f"{shape}: another client waited {max(waits):.2f} s"


@pytest.mark.fuzz
@pytest.mark.parametrize("dialect_name", sorted(DIALECTS))
async def test_resent_history_at_the_limit_beside_other_requests(
    dialect_name,
    fake,  # noqa: F811
    request,
    monkeypatch,
):
    """A history at the message limit, then re-sent with a new turn as a harness does:
    the re-send is parsed, decoded and stored from where the first one ended, so it costs
    a fraction of the first, and the other client's waits beside both stay bounded (the
    first one's bulk runs in the worker thread, ``gateway.offload``)."""
    config, _ = stall_config(fake, request, monkeypatch)
    path = DIALECTS[dialect_name].path
    first, resent = limit_history(dialect_name, config.max_messages)
    app = create_app(config)
    async with app.router.lifespan_context(app):
        took: list[float] = []
        answers, most = [], []
        for req in (first, resent):

            async def send(req: Any = req) -> Any:
                started = time.perf_counter()
                answer = await post(app, path, req.body, req.headers)
                took.append(time.perf_counter() - started)
                await app.state.pipeline.drain()
                return answer

            answer, waits, statuses = await beside_other_client(app, send)
            assert statuses == {200}
            answers.append(answer)
            most.append(max(waits))
    for answer in answers:
        assert (answer.status, judge(dialect_name, answer)) == (200, None), answer.body[:300]
    # Ratios within the run, not wall-clock bounds: a loaded machine slows both sides alike.
    # Held on the loop, the other client would wait about as long as the first request took.
    for which, wait in zip(("first", "re-send"), most, strict=True):
        assert wait < took[0] / 2, (
            f"another client waited {wait:.2f} s beside the {which}; the first took {took[0]:.2f} s"
        )
    # The re-send's gateway work is the new turn's; the fake upstream still reads all of it.
    assert took[1] < took[0] / 2, f"re-send {took[1]:.2f} s against {took[0]:.2f} s"


# Only breaks the deadlock of a step held on the event loop itself (what the test refutes).
HOLD_S = 10.0
LARGE = 1_000  # items: the limit history has ~10,000, the other client's request 1


class Hold:
    """Holds the first call of a step over a large input until the test releases it:
    ``started`` once the call is held, ``released`` whether the test's release (not the
    timeout) let it go on."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.released: bool | None = None

    def wrap(self, step: Any, size: Any) -> Any:
        @functools.wraps(step)
        def held(*args: Any, **kwargs: Any) -> Any:
            if self.released is None and size(*args, **kwargs) >= LARGE:
                self.started.set()
                self.released = self.release.wait(HOLD_S)
            return step(*args, **kwargs)

        return held


def _items(_cache: Any, _dialect: Any, body: Any, *_: Any, **__: Any) -> int:
    return len(body.get("messages") or body.get("input") or ())


# Each step whose cost grows with the history: where the large request is held.
HELD_STEPS = {
    "decode": (DecodeCache, "decode", _items),
    "pack": (DigestCache, "prepare", lambda _c, _t, _s, messages, **_: len(messages)),
    "render": (Render, "__call__", lambda _r, prepared: len(prepared.history)),
    "encode": (MessageMemo, "messages_json", lambda _m, messages: len(messages)),
}


@pytest.mark.fuzz
@pytest.mark.parametrize(
    ("dialect_name", "step", "shape"),
    [("openai", step, "new") for step in HELD_STEPS]
    + [("openai", "decode", "rewritten"), ("openai", "render", "rewritten")]
    + [(name, "decode", "new") for name in sorted(DIALECTS) if name != "openai"],
)
async def test_other_clients_are_answered_while_a_large_history_is_in_progress(
    dialect_name,
    step,
    shape,
    fake,  # noqa: F811
    request,
    monkeypatch,
):
    """A history at the message limit that the gateway has not seen (``new``: a session's
    first request; ``rewritten``: a re-send that does not extend the last one) is held in
    the middle of one of its bulk steps: meanwhile another client's chat request and
    ``/health`` are answered, and the large one completes once released. Held on the event
    loop, nothing else could run until the hold timed out."""
    config, _ = stall_config(fake, request, monkeypatch)
    path = DIALECTS[dialect_name].path
    first, _ = limit_history(dialect_name, config.max_messages)
    small = Request(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        [(b"x-session-id", b"the-other-client")],
    )
    hold = Hold()
    owner, name, size = HELD_STEPS[step]
    app = create_app(config)
    async with app.router.lifespan_context(app):
        if shape == "rewritten":
            answer = await post(app, path, first.body, first.headers)
            assert answer.status == 200, answer.body[:300]
            await app.state.pipeline.drain()
            first = rewritten(first)
        monkeypatch.setattr(owner, name, hold.wrap(getattr(owner, name), size))
        large = asyncio.create_task(post(app, path, first.body, first.headers))
        assert await asyncio.to_thread(hold.started.wait, HOLD_S)
        other = await post(app, DIALECTS["openai"].path, small.body, small.headers)
        health_status = await health(app)
        hold.release.set()
        answer = await large
        await app.state.pipeline.drain()
    assert hold.released, f"the {step} step held the event loop: nothing ran beside it"
    assert (other.status, judge("openai", other)) == (200, None), other.body[:300]
    assert health_status == 200
    assert (answer.status, judge(dialect_name, answer)) == (200, None), answer.body[:300]
