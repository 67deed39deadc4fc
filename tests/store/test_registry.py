"""``open_store``: the backend a URL's scheme names in the registration table."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import open_store, registry
from store.sqlite import SQLiteStore
from tests.store.recording_store import RecordingStore


def test_open_store_picks_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLDGATE_HOME", str(tmp_path / "home"))
    default = open_store(None)
    assert isinstance(default, SQLiteStore)
    assert default.path == str(tmp_path / "home" / "store.db")
    assert isinstance(open_store(f"sqlite://{tmp_path}/x.db"), SQLiteStore)
    with pytest.raises(ValueError, match="unknown store URL scheme 'mysql'"):
        open_store("mysql://x")
    with pytest.raises(ValueError, match="has no scheme"):
        open_store("localhost:6379")


def test_a_registered_backend_opens_by_its_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        registry.BACKENDS, "recording", "tests.store.recording_store:RecordingStore"
    )
    store = open_store("recording://somewhere", ttl_s=5)
    assert isinstance(store, RecordingStore)
    assert (store.url, store.ttl_s) == ("recording://somewhere", 5)
    registered = ", ".join(sorted(registry.BACKENDS))
    with pytest.raises(ValueError, match=f"expected one of {registered}"):
        open_store("mysql://x")


def test_a_sqlite_url_must_name_a_file() -> None:
    with pytest.raises(ValueError, match="names no database file"):
        open_store("sqlite://")
