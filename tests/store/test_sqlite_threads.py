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


async def test_quick_calls_queue_behind_the_worker_rather_than_overtake_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    ran: list[tuple[str, int]] = []

    def call(name: str, pause_s: float = 0.0) -> Callable[[sqlite3.Connection], None]:
        def fn(conn: sqlite3.Connection) -> None:
            time.sleep(pause_s)
            ran.append((name, threading.get_ident()))

        return fn

    try:
        await store.db.run(call("first quick"), quick=True)
        slow = asyncio.create_task(store.db.run(call("slow", 0.2)))  # on the worker
        await asyncio.sleep(0.05)
        await store.db.run(call("quick while the worker is busy"), write=True, quick=True)
        await slow
        await store.db.run(call("quick again"), quick=True)
    finally:
        await store.close()
    names = [name for name, _ in ran]
    assert names == ["first quick", "slow", "quick while the worker is busy", "quick again"]
    loop_thread = threading.get_ident()
    threads = [thread for _, thread in ran]
    assert threads[0] == threads[3] == loop_thread
    assert threads[1] == threads[2] != loop_thread
