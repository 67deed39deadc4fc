"""Both store backends behind one fixture, each test in its own tenant."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from store import SessionStore, open_store

StoreFactory = Callable[..., SessionStore]


@pytest.fixture(params=["redis", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens stores of the parametrized backend; all of one test share the same data."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        url = f"sqlite://{tmp_path / 'store.db'}"

    def make(**options: Any) -> SessionStore:
        return open_store(url, **options)

    return make


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[SessionStore]:
    s = make_store()
    yield s
    await s.close()


@pytest.fixture
def tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:12]}"


def msg(role: str, text: str, **extra: Any) -> dict[str, Any]:
    """A message in the transcript model's plain dict form."""
    return {"role": role, "parts": [{"type": "text", "text": text}], **extra}


def history(n: int, tag: str = "") -> list[dict[str, Any]]:
    roles = ("user", "assistant")
    return [msg(roles[i % 2], f"{tag}message {i}") for i in range(n)]
