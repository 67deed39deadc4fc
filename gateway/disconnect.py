"""Cancel a request's work when its client disconnects.

A client that goes away while the gateway waits for the upstream (before the first byte,
or during a non-streaming reply) would otherwise leave the replica generating for no one.
After the request's body is read, the ASGI ``receive`` channel has nothing left to say but
``http.disconnect``, so waiting on it beside the work tells when to cancel. Cancelling
closes the upstream connection (``gateway.upstream``), which aborts the generation. A
streaming reply needs none of this: its next write to a gone client fails, which closes
the stream and the upstream with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import suppress
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work finished; the work was cancelled."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of ``work``, which is cancelled if the client disconnects first (raising
    ``ClientGone``). Call only once the request's body has been read."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
