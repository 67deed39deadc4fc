"""Slow and idle connections cannot starve complete requests (a real ``foldgate serve``).

Connections that never finish their headers cost a client nothing: they must not count
against the requests a gateway serves, a peer keeps only a bounded number of them, and
the gateway's own overload answer is in the endpoint's error shape.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from pathlib import Path

import httpx

from gateway.config import GatewayConfig
from gateway.http_server import HeaderPhase
from gateway.tenants import hash_key
from loadtests.fake_upstream import FakeUpstream
from tests.gateway.conftest import gateway_process

KEY = "key-acme"
HEADERS = {"x-api-key": KEY}
PER_CLIENT = 4
# Far more slow connections than the peer may keep, and than the requests served at once
# (uvicorn's own limit counted them: every complete request got a plain-text 503).
SLOW = 3 * PER_CLIENT
MAX_REQUESTS = PER_CLIENT + 2
# Bounds on what the gateway must do promptly; the header timeout is far longer, so
# nothing here passes by a timeout closing the slow connections.
PROMPT_S = 10.0


def config(fake: FakeUpstream, tmp_path: Path, **overrides: object) -> GatewayConfig:
    return GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db",
        replicas=(fake.url,),
        api_keys={hash_key(KEY): "acme"},
        header_timeout_s=120.0,
        header_connections_per_client=PER_CLIENT,
        **overrides,  # type: ignore[arg-type]
    )


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


async def open_slow(
    url: str, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection (from address ``source``) that sends a request line and one header,
    and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    local = None if source is None else (source, 0)
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=local)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    await writer.drain()
    return reader, writer


def _closed_unanswered(read: asyncio.Future[bytes]) -> bool:
    error = read.exception()
    return isinstance(error, ConnectionResetError) if error else read.result() == b""


async def closed_by_server(readers: list[asyncio.StreamReader], count: int) -> int:
    """Waits (at most ``PROMPT_S``) until ``count`` of the connections are closed by the
    server; how many are."""
    reads = [asyncio.ensure_future(r.read()) for r in readers]
    deadline = time.monotonic() + PROMPT_S
    done: set[asyncio.Future[bytes]] = set()
    try:
        while len(done) < count and time.monotonic() < deadline:
            finished, _ = await asyncio.wait(
                set(reads) - done,
                timeout=deadline - time.monotonic(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            done |= finished
        # Closed without an answer: an end of stream, or a reset when the server closed
        # with bytes it had not read yet (the kernel answers those with RST).
        assert all(_closed_unanswered(f) for f in done)
        return len(done)
    finally:
        for f in reads:
            f.cancel()


async def test_slow_connections_of_a_peer_neither_pile_up_nor_starve_its_requests(
    tmp_path: Path,
) -> None:
    fake = await FakeUpstream().start()
    writers: list[asyncio.StreamWriter] = []
    try:
        async with (
            gateway_process(config(fake, tmp_path, max_concurrency=MAX_REQUESTS), tmp_path) as (
                url,
                _,
            ),
            httpx.AsyncClient(timeout=PROMPT_S) as client,
        ):
            slow = [await open_slow(url) for _ in range(SLOW)]
            writers = [w for _, w in slow]
            # The peer keeps PER_CLIENT of them; the server closes the rest, oldest first.
            closed = await closed_by_server([r for r, _ in slow], SLOW - PER_CLIENT)
            assert closed == SLOW - PER_CLIENT
            # Complete requests of the same host are served beside the slow ones left.
            for step in range(3):
                resp = await client.post(
                    f"{url}/v1/chat/completions", json=chat(f"step {step}"), headers=HEADERS
                )
                assert resp.status_code == 200, resp.text
            assert (await client.get(f"{url}/health")).status_code == 200
    finally:
        for w in writers:
            w.close()
        await fake.stop()


async def test_past_its_request_limit_the_gateway_answers_in_the_endpoints_shape(
    tmp_path: Path,
) -> None:
    fake = await FakeUpstream().start()
    held: asyncio.StreamWriter | None = None
    try:
        async with (
            gateway_process(config(fake, tmp_path, max_concurrency=1), tmp_path) as (url, _),
            httpx.AsyncClient(timeout=PROMPT_S) as client,
        ):
            # One authenticated request in flight: its body never comes.
            _, held = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
            held.write(
                b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: " + KEY.encode() + b"\r\n"
                b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"
            )
            await held.drain()
            answers: dict[str, httpx.Response] = {}
            deadline = time.monotonic() + PROMPT_S
            # Until the held request is in flight, another one may still be served.
            while len(answers) < 2 and time.monotonic() < deadline:
                for path in ("/v1/messages", "/v1/chat/completions"):
                    resp = await client.post(f"{url}{path}", json=chat("x"), headers=HEADERS)
                    if resp.status_code == 503:
                        answers[path] = resp
                    else:
                        assert resp.status_code == 200, resp.text
            anthropic, openai = answers["/v1/messages"], answers["/v1/chat/completions"]
            for resp in (anthropic, openai):
                assert resp.headers["content-type"].startswith("application/json")
                assert int(resp.headers["retry-after"]) >= 1
            assert anthropic.json()["type"] == "error"
            assert anthropic.json()["error"]["type"] == "overloaded_error"
            assert openai.json()["error"]["type"] == "overloaded_error"
            # Once the held request ends, the gateway serves again.
            held.close()
            held = None
            while time.monotonic() < deadline:
                resp = await client.post(
                    f"{url}/v1/chat/completions", json=chat("after"), headers=HEADERS
                )
                if resp.status_code != 503:
                    break
            assert resp.status_code == 200, resp.text
    finally:
        if held is not None:
            held.close()
        await fake.stop()


def test_each_peer_keeps_its_own_bound_of_connections_awaiting_headers() -> None:
    phase = HeaderPhase(per_client=2, total=100)
    closed: list[str] = []

    def enter(client: str, name: str) -> None:
        for close in phase.enter(client, name, lambda: closed.append(name)):
            close()

    for name in ("a1", "a2", "a3", "a4"):
        enter("10.0.0.1", name)
    enter("10.0.0.2", "b1")
    assert closed == ["a1", "a2"]  # the oldest go; another peer's are not touched
    assert (phase.waiting("10.0.0.1"), phase.waiting("10.0.0.2")) == (2, 1)
    phase.leave("10.0.0.1", "a3")  # its headers arrived
    phase.leave("10.0.0.1", "a1")  # pushed out before: nothing to do
    enter("10.0.0.1", "a5")
    assert closed == ["a1", "a2"] and phase.waiting("10.0.0.1") == 2


def test_all_peers_together_keep_a_bound_of_connections_awaiting_headers() -> None:
    phase = HeaderPhase(per_client=2, total=3)
    closed: list[str] = []

    def enter(client: str, name: str) -> None:
        for close in phase.enter(client, name, lambda: closed.append(name)):
            close()

    for peer in ("a", "b", "c", "d"):  # each within its own bound
        enter(peer, f"{peer}1")
    assert closed == ["a1"] and phase.waiting() == 3  # the oldest of all went
    phase.leave("b", "b1")  # its headers arrived
    enter("e", "e1")
    enter("e", "e2")  # e's own bound holds; the oldest of all goes for the total
    assert closed == ["a1", "c1"]
    assert [phase.waiting(p) for p in "abcde"] == [0, 0, 0, 1, 2]
    phase.leave("c", "c1")  # pushed out before: nothing to do
    assert phase.waiting() == 3


PEERS = 60  # source addresses 127.0.0.2 ... (all loopback on Linux)
TOTAL = 16


async def test_slow_connections_from_many_peers_cannot_take_every_file_descriptor(
    tmp_path: Path,
) -> None:
    """Each of many addresses within its own bound, together more slow connections than
    the process has file descriptors left: without a bound over all peers the gateway could
    accept no connection, and every authenticated request waited (for the header timeout,
    two minutes here)."""
    fake = await FakeUpstream().start()
    writers: list[asyncio.StreamWriter] = []
    try:
        gateway = config(fake, tmp_path, header_connections_total=TOTAL)
        async with (
            gateway_process(gateway, tmp_path) as (url, proc),
            httpx.AsyncClient(timeout=PROMPT_S) as client,
        ):
            # Room for the process's own files and a few connections, not for PEERS *
            # PER_CLIENT more.
            in_use = len(os.listdir(f"/proc/{proc.pid}/fd"))
            _, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (in_use + 3 * TOTAL, hard))
            slow = [
                await open_slow(url, f"127.0.0.{2 + peer}")
                for peer in range(PEERS)
                for _ in range(PER_CLIENT)
            ]
            writers = [w for _, w in slow]
            for step in range(3):
                resp = await client.post(
                    f"{url}/v1/chat/completions", json=chat(f"step {step}"), headers=HEADERS
                )
                assert resp.status_code == 200, resp.text
            # The server closed all but the youngest TOTAL of them, unanswered (or one more
            # for each request above: its headers took a place in the phase too).
            closed = await closed_by_server([r for r, _ in slow], len(slow) - TOTAL)
            assert closed >= len(slow) - TOTAL
            assert proc.poll() is None
        # Accepts that failed meanwhile (a loaded machine lets the listener take a burst
        # before the phase closes any) are a line per interval: a traceback each wrote
        # megabytes here, and into a pipe no one read, the gateway blocked in its logger.
        log = b"".join(p.read_bytes() for p in tmp_path.glob("gw-*.log"))
        assert len(log) < 16_384, log[-2_000:]
    finally:
        for w in writers:
            w.close()
        await fake.stop()


def test_idle_connections_count_toward_the_total_only() -> None:
    phase = HeaderPhase(per_client=1, total=3)
    closed: list[str] = []

    def push(pushed_out: list) -> None:
        for close in pushed_out:
            close()

    for name in ("a1", "a2", "a3"):  # kept alive after their requests: all one peer's
        push(phase.idle("10.0.0.1", name, lambda name=name: closed.append(name)))
    assert closed == [] and phase.waiting() == 3 and phase.waiting("10.0.0.1") == 0
    push(phase.enter("10.0.0.2", "b1", lambda: closed.append("b1")))
    assert closed == ["a1"]  # the oldest of all, idle or not
    # An idle connection's next request: sending its headers now, within its peer's bound.
    push(phase.enter("10.0.0.1", "a2", lambda: closed.append("a2")))
    assert closed == ["a1"] and phase.waiting("10.0.0.1") == 1 and phase.waiting() == 3
    phase.leave("10.0.0.1", "a2")
    assert phase.waiting() == 2


async def open_idle(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends one complete request, reads its answer, and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return reader, writer


async def test_idle_connections_cannot_take_every_file_descriptor(tmp_path: Path) -> None:
    """Connections kept alive after a request and then left idle (one address: no peer
    bound applies to them) are closed oldest first past the total, as the slow ones are."""
    fake = await FakeUpstream().start()
    writers: list[asyncio.StreamWriter] = []
    try:
        gateway = config(fake, tmp_path, header_connections_total=TOTAL, keep_alive_s=120.0)
        async with (
            gateway_process(gateway, tmp_path) as (url, proc),
            httpx.AsyncClient(timeout=PROMPT_S) as client,
        ):
            in_use = len(os.listdir(f"/proc/{proc.pid}/fd"))
            _, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (in_use + 3 * TOTAL, hard))
            idle = [await open_idle(url) for _ in range(PEERS * PER_CLIENT)]
            writers = [w for _, w in idle]
            for step in range(3):
                resp = await client.post(
                    f"{url}/v1/chat/completions", json=chat(f"step {step}"), headers=HEADERS
                )
                assert resp.status_code == 200, resp.text
            closed = await closed_by_server([r for r, _ in idle], len(idle) - TOTAL)
            assert closed >= len(idle) - TOTAL
            assert proc.poll() is None
    finally:
        for w in writers:
            w.close()
        await fake.stop()
