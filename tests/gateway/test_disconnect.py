"""OnDisconnect: a client's disconnect cancels the work inside the block, and only there."""

from __future__ import annotations

import asyncio

import pytest

from gateway.disconnect import ClientGone, OnDisconnect


def channel() -> tuple[asyncio.Queue[dict[str, str]], object]:
    """An ASGI receive channel the test feeds."""
    messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    return messages, messages.get


async def test_a_disconnect_cancels_the_block_and_leaves_the_task_uncancelled() -> None:
    messages, receive = channel()
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()  # the work's own cleanup (closing the upstream) ran

    async def request() -> int:
        with pytest.raises(ClientGone):
            async with OnDisconnect(receive):
                await work()
        # The cancellation was the watcher's and is taken back: later waits and
        # timeouts in the same task behave as usual.
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            await asyncio.sleep(0.01)
        return asyncio.current_task().cancelling()  # type: ignore[union-attr]

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    messages.put_nowait({"type": "http.request"})  # not a disconnect: nothing happens
    await asyncio.sleep(0.01)
    assert not task.done()
    messages.put_nowait({"type": "http.disconnect"})
    assert await task == 0
    assert cleaned.is_set()


async def test_after_the_block_a_disconnect_cancels_nothing() -> None:
    messages, receive = channel()
    async with OnDisconnect(receive):
        await asyncio.sleep(0)
    messages.put_nowait({"type": "http.disconnect"})
    await asyncio.sleep(0.01)  # a watcher still alive would cancel this sleep
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_an_outside_cancellation_is_not_taken_for_a_disconnect() -> None:
    _, receive = channel()

    async def request() -> None:
        async with OnDisconnect(receive):
            await asyncio.sleep(30)

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
