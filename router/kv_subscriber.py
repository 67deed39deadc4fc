"""The subscriber of the replicas' KV events: one ZMQ SUB socket per replica, feeding its
``router.kv_events.KvIndex``.

A replica at ``http://host:port`` publishes on ``tcp://host:(port + port_offset)``
(``--kv-events-config`` with that endpoint: deploy/cpu and the chart start them so). A
replica is subscribed to the first time the gateway asks about it, so replicas that DNS
adds are followed without a restart. ZMQ reconnects on its own when a replica restarts
(whose cache then starts empty: its first events after a gap in the sequence numbers
would otherwise leave stale blocks, so a gap clears that replica's index: its sessions
then read as cold until their next request, the safe side).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from router.kv_events import KvEventError, KvIndex, decode_batch

log = logging.getLogger(__name__)


def events_endpoint(replica_url: str, port_offset: int) -> str:
    """Where the replica at ``replica_url`` publishes its KV events."""
    parts = urlsplit(replica_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port + port_offset}"


class KvEventSubscriber:
    def __init__(self, port_offset: int) -> None:
        self.port_offset = port_offset
        self.indexes: dict[str, KvIndex] = {}
        self._context: zmq.asyncio.Context | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def index(self, replica_url: str) -> KvIndex:
        """The replica's index, subscribing to its events the first time."""
        found = self.indexes.get(replica_url)
        if found is None:
            found = self.indexes[replica_url] = KvIndex()
            if self._context is None:
                self._context = zmq.asyncio.Context()
            endpoint = events_endpoint(replica_url, self.port_offset)
            self._tasks[replica_url] = asyncio.create_task(
                self._listen(endpoint, found), name=f"kv-events {replica_url}"
            )
        return found

    async def _listen(self, endpoint: str, index: KvIndex) -> None:
        assert self._context is not None
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        expected: int | None = None
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    continue
                _, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if expected is not None and seq != expected:
                    log.warning("KV events of %s: sequence %d after %d", endpoint, seq, expected)
                    index.held.clear()
                expected = seq + 1
                try:
                    _, events = decode_batch(payload)
                except KvEventError as exc:
                    log.warning("KV events of %s: %s", endpoint, exc)
                    continue
                index.apply(events)
        finally:
            sock.close(0)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._context is not None:
            self._context.term()
            self._context = None
