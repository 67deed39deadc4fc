"""The SQLite backend opens databases written by earlier versions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store.sqlite import SQLiteStore
from tests.store.conftest import history


async def test_a_database_of_an_earlier_version_loses_its_render_states(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE states (sid INTEGER, branch INTEGER, version INTEGER, data BLOB,"
        " PRIMARY KEY (sid, branch)) WITHOUT ROWID"
    )
    old.execute("INSERT INTO states VALUES (1, 0, 3, x'00')")
    old.commit()
    old.close()

    store = SQLiteStore(path)
    try:
        await store.ingest("t", "s", history(3))
        assert len((await store.load("t", "s")).messages) == 3
    finally:
        await store.close()
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "states" not in tables
    assert {"sessions", "messages", "blobs"} <= tables
