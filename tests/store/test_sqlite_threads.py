"""The SQLite backend runs short calls on the event loop's thread, and never waits there."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from store.sqlite import SQLiteStore
from tests.store.conftest import history


async def test_a_database_locked_elsewhere_sends_the_call_to_the_worker(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        await store.ingest("t", "s", history(2))  # on the loop's thread
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's write in progress
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beating = asyncio.create_task(ticker())
        started = time.monotonic()
        counting = asyncio.create_task(store.add_counts("t", "s", 0, {"requests": 1}, token="a"))
        await asyncio.sleep(0.3)
        assert not counting.done()  # waiting for the lock, in the worker thread ...
        assert ticks >= 10  # ... while the event loop kept running
        other.execute("COMMIT")
        await counting
        beating.cancel()
        assert time.monotonic() - started >= 0.3
        assert (await store.get_counts("t", "s", 0))["requests"] == 1
        other.close()
    finally:
        await store.close()


def recording(ran: list[tuple[str, int]]) -> Callable[..., Callable[[sqlite3.Connection], None]]:
    def call(name: str, pause_s: float = 0.0) -> Callable[[sqlite3.Connection], None]:
        def fn(conn: sqlite3.Connection) -> None:
            time.sleep(pause_s)
            ran.append((name, threading.get_ident()))

        return fn

    return call


async def test_quick_calls_wait_for_the_worker_on_the_loop_rather_than_overtake_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    ran: list[tuple[str, int]] = []
    call = recording(ran)
    try:
        await store.db.run(call("first quick"), quick=True)
        slow = asyncio.create_task(store.db.run(call("slow", 0.2)))  # on the worker
        await asyncio.sleep(0.05)
        await store.db.run(call("quick while the worker is busy"), write=True, quick=True)
        assert slow.done()
        await store.db.run(call("quick again"), quick=True)
    finally:
        await store.close()
    names = [name for name, _ in ran]
    assert names == ["first quick", "slow", "quick while the worker is busy", "quick again"]
    loop_thread = threading.get_ident()
    threads = [thread for _, thread in ran]
    # Only the slow call left the loop's thread: the quick ones did not follow it there.
    assert threads[0] == threads[2] == threads[3] == loop_thread != threads[1]


async def test_a_cancelled_call_keeps_the_order_of_those_after_it(tmp_path: Path) -> None:
    """A caller gone while its call waits, or while its job runs on the worker, does not
    let a later call run before the calls ahead of it."""
    store = SQLiteStore(tmp_path / "s.db")
    ran: list[str] = []
    gates = {name: (threading.Event(), threading.Event()) for name in ("slow", "running")}

    def blocking(name: str) -> Callable[[sqlite3.Connection], None]:
        def fn(conn: sqlite3.Connection) -> None:
            started, release = gates[name]
            started.set()
            release.wait(5)
            ran.append(name)

        return fn

    def quick(name: str) -> Callable[[sqlite3.Connection], None]:
        return lambda conn: ran.append(name)

    async def cycles() -> None:  # let every task run to its next wait
        for _ in range(5):
            await asyncio.sleep(0)

    try:
        slow = asyncio.create_task(store.db.run(blocking("slow")))
        await asyncio.to_thread(gates["slow"][0].wait, 5)
        waiting = asyncio.create_task(store.db.run(quick("gone while waiting"), quick=True))
        running = asyncio.create_task(store.db.run(blocking("running")))
        await cycles()
        waiting.cancel()
        slow.cancel()  # its job runs on
        later = asyncio.create_task(store.db.run(quick("later"), quick=True))
        gates["slow"][1].set()
        await asyncio.to_thread(gates["running"][0].wait, 5)
        running.cancel()  # its job runs on too
        await cycles()
        assert not later.done()  # behind the job of the cancelled call
        gates["running"][1].set()
        await later
        assert slow.cancelled() and waiting.cancelled() and running.cancelled()
    finally:
        for _, release in gates.values():
            release.set()
        await store.close()
    assert ran == ["slow", "running", "later"]
