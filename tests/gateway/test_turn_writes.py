"""A connection's writes in one turn of the event loop go out as one (``TurnWrites``), and
a streamed reply still streams: each frame goes out in the turn it was written in."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from gateway.config import GatewayConfig
from gateway.http_server import TurnWrites
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from loadtests.local_servers import running_gateway


class Recorded:
    """A real transport, each of its writes recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@asynccontextmanager
async def connection() -> AsyncIterator[tuple[TurnWrites, Recorded, socket.socket]]:
    """``TurnWrites`` over a recorded transport of one end of a socket pair; the other end."""
    ours, peer = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
    recorded = Recorded(transport)  # type: ignore[arg-type]
    try:
        yield TurnWrites(recorded), recorded, peer  # type: ignore[arg-type]
    finally:
        transport.close()
        peer.close()


async def read_all(peer: socket.socket) -> bytes:
    """What the peer receives until the connection's end."""
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(peer, 65536), 5):
        data += chunk
    return data


async def test_the_writes_of_one_turn_go_out_as_one_write_when_the_turn_ends() -> None:
    async with connection() as (writes, recorded, peer):
        writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writes.write(b"data: 1\n\n")
        writes.write(b"data: 2\n\n")
        assert recorded.writes == []  # the turn is not over
        await asyncio.sleep(0)
        assert recorded.writes == [b"HTTP/1.1 200 OK\r\n\r\ndata: 1\n\ndata: 2\n\n"]
        writes.write(b"data: 3\n\n")  # a later turn: its own write
        await asyncio.sleep(0)
        assert recorded.writes[1:] == [b"data: 3\n\n"]
        writes.close()
        assert await read_all(peer) == b"HTTP/1.1 200 OK\r\n\r\ndata: 1\n\ndata: 2\n\ndata: 3\n\n"


async def test_close_writes_what_is_pending_first() -> None:
    async with connection() as (writes, recorded, peer):
        writes.write(b"last frame")
        writes.close()
        assert recorded.writes == [b"last frame"]
        assert await read_all(peer) == b"last frame"  # then the end of the stream
        await asyncio.sleep(0)  # the turn's flush finds nothing more
        assert recorded.writes == [b"last frame"]


async def test_what_is_pending_when_the_transport_closes_is_dropped() -> None:
    async with connection() as (writes, recorded, _):
        writes.write(b"for a connection gone")
        recorded.transport.close()
        await asyncio.sleep(0)
        assert recorded.writes == []


async def test_a_streamed_reply_through_the_server_still_streams(tmp_path) -> None:
    """Through uvicorn with the gateway's protocol: each frame leaves when it is written, not
    with the stream's end (5 chunks, 0.3 s apart)."""
    reply = ScriptedReply(content="abcdefghij" * 4, chunk_chars=8, chunk_delay_s=0.3)
    fake = await FakeUpstream(default=reply).start()
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=(fake.url,))
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True}
    try:
        async with (
            running_gateway(config) as url,
            httpx.AsyncClient(timeout=30) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status_code == 200
            arrived = []
            async for line in resp.aiter_lines():
                if '"content":"' in line:
                    arrived.append(time.monotonic())
    finally:
        await fake.stop()
    assert len(arrived) == 5
    # The first frame came ~1.2 s before the last one (4 gaps of 0.3 s), not with it.
    assert arrived[-1] - arrived[0] > 0.8, arrived
