"""The fuzz suite's second check: every request's incremental path equals the full path.

The gateway parses a re-sent body only after what the session's previous body held
(``ResentBodies``), decodes only the items the previous request lacked (``DecodeCache``)
and packs and digests only the messages the store's digest cache has not seen
(``DigestCache``). Here each of them runs beside the full path for every request of the
fuzz run: the parse beside ``parse_object`` (where a prefix was kept: else the parse is
that one), the decode beside ``Dialect.decode``, and the store beside a twin store
without a digest cache that receives the same history writes in the same order. The
parsed bodies, the decoded transcripts, the errors (type, status, message, param), every
store write's result and, after the run, every session's stored head must be equal;
each difference is recorded in ``mismatches``.

The twin's writes follow the main store's under one lock, so both see the same order of
operations (history writes of concurrent requests are serialized, which the store's own
transactions would order anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from gateway.dialects.base import Dialect
from gateway.dialects.errors import DialectError
from gateway.request_cache import DecodeCache, Decoded, envelope_within
from gateway.resent_body import ResentBodies, parse_object
from store import SessionStore
from store.codec import same_value


def _outcome(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(value, None) or (None, the exception) of one call."""
    try:
        return call(*args, **kwargs), None
    except Exception as exc:  # compared, then raised again
        return None, exc


def _error(exc: BaseException | None) -> tuple[Any, ...] | None:
    if exc is None:
        return None
    if isinstance(exc, DialectError):
        return (type(exc), exc.status, str(exc), exc.param, exc.code)
    return (type(exc), str(exc))


class CheckedBodies(ResentBodies):
    """``ResentBodies`` whose every parse is compared with ``parse_object``'s."""

    def __init__(self, max_bytes: int, max_items: int, mismatches: list[str]) -> None:
        super().__init__(max_bytes, max_items)
        self.mismatches = mismatches

    def parse(self, raw: bytes | bytearray, key: Hashable, field: str | None) -> dict[str, Any]:
        if key not in self:
            return super().parse(raw, key, field)  # nothing kept: the full path itself
        body, exc = _outcome(super().parse, raw, key, field)
        full, full_exc = _outcome(parse_object, bytes(raw))
        if _error(exc) != _error(full_exc) or not same_value(body, full):
            self.mismatches.append(
                f"parse: incremental {_error(exc) or 'ok'} vs full {_error(full_exc) or 'ok'}"
                f" of {bytes(raw[:200])!r}"
            )
        if exc is not None:
            raise exc
        return body


def full_decode(dialect: Dialect, body: Any, max_messages: int) -> Decoded:
    """The request decoded from scratch: ``Dialect.decode``, volatile markers dropped."""
    envelope_within(dialect, body, max_messages)  # the same item limit
    return Decoded.full(dialect.decode(body))


class CheckedDecodeCache(DecodeCache):
    """``DecodeCache`` whose every decode is compared with ``full_decode``'s."""

    def __init__(self, max_bytes: int, max_messages: int, mismatches: list[str]) -> None:
        super().__init__(max_bytes, max_messages)
        self.mismatches = mismatches

    def decode(
        self, dialect: Dialect, body: Any, ids: Sequence[Any] = (), *, tenant: str
    ) -> Decoded:
        decoded, exc = _outcome(super().decode, dialect, body, ids, tenant=tenant)
        full, full_exc = _outcome(full_decode, dialect, body, self.max_messages)
        same = _error(exc) == _error(full_exc) and (
            exc is not None
            or (decoded.transcript, decoded.stored, decoded.tokens, decoded.placeholders)
            == (full.transcript, full.stored, full.tokens, full.placeholders)
        )
        if not same:
            self.mismatches.append(
                f"decode: incremental {_error(exc) or 'ok'} vs full {_error(full_exc) or 'ok'}"
                f" of {str(body)[:200]}"
            )
        if exc is not None:
            raise exc
        return decoded


class MirroredStore:
    """The gateway's store, its history writes repeated on ``twin`` (no digest cache) in
    the same order, their results compared. (Reads, ``lookup`` among them, go to the
    gateway's store only: what they find shows in the writes that follow.)"""

    def __init__(self, store: SessionStore, twin: SessionStore, mismatches: list[str]) -> None:
        self._store = store
        self._twin = twin
        self._lock = asyncio.Lock()
        self.mismatches = mismatches

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def close(self) -> None:
        await self._store.close()
        await self._twin.close()

    async def ingest(self, tenant: str, session: str, *args: Any, **kwargs: Any) -> Any:
        return await self._both("ingest", tenant, session, args, kwargs)

    async def append_gateway_turns(self, tenant: str, session: str, *args: Any) -> Any:
        return await self._both("append_gateway_turns", tenant, session, args, {})

    async def delete_session(self, tenant: str, session: str) -> Any:
        return await self._both("delete_session", tenant, session, (), {})

    async def _both(
        self,
        name: str,
        tenant: str,
        session: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        async with self._lock:
            result, exc = await _call(getattr(self._store, name), tenant, session, args, kwargs)
            twin, twin_exc = await _call(getattr(self._twin, name), tenant, session, args, kwargs)
            if _error(exc) != _error(twin_exc) or _comparable(result) != _comparable(twin):
                self.mismatches.append(
                    f"store.{name}({session!r}): {result!r} / {_error(exc)} vs full path's "
                    f"{twin!r} / {_error(twin_exc)}"
                )
        if exc is not None:
            raise exc
        return result

    async def compare(self, tenant: str) -> None:
        """Record how the two stores' sessions and their heads differ (after the run: each
        write's result was compared as it happened)."""
        sessions = sorted(await self._store.list_sessions(tenant))
        if sessions != sorted(await self._twin.list_sessions(tenant)):
            self.mismatches.append(f"store: other sessions than the full path's: {sessions}")
            return
        for session in sessions:
            head = await self._store.load(tenant, session)
            twin = await self._twin.load(tenant, session)
            if head != twin:
                self.mismatches.append(
                    f"store: session {session!r} holds {str(head)[:300]} against the full "
                    f"path's {str(twin)[:300]}"
                )


async def _call(
    method: Callable[..., Any], tenant: str, session: str, args: tuple[Any, ...], kwargs: Any
) -> tuple[Any, BaseException | None]:
    try:
        return await method(tenant, session, *args, **kwargs), None
    except Exception as exc:  # compared, then raised again
        return None, exc


def _comparable(result: Any) -> Any:
    """A store call's result but the branch counters (``Lookup.counts``: the accounting,
    which the twin does not receive)."""
    counts = getattr(result, "counts", None)
    if counts is None:
        return result
    return (result.branch, result.stored, dict(result.gateway_turns), result.assignment)
