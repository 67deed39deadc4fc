"""Redis backend: redis-py asyncio + hiredis, one pool per store, atomic Lua writes.

Keys of one session share the hash tag ``{<tenant>/<session>}`` (Cluster-safe) and are
namespaced by tenant; the tenant's session index lives under its own tag and is kept
best-effort beside the atomic per-session writes (a session is listed after its first
successful ingest). Layout: see ``store.redis_lua``. Create one store per process.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from store import codec, redis_lua
from store.base import (
    COUNT_TOKEN_TTL_S,
    DEFAULT_TIMEOUT_S,
    Assign,
    Charge,
    IngestResult,
    Lookup,
    Message,
    NotFound,
    Refusal,
    SessionStore,
    StoredHistory,
    StoreUnavailable,
    added_bytes,
    ancestry,
    assemble,
    bad_after_index,
    blob_texts,
    check_assign,
    check_branch,
    check_counts,
    check_id,
    check_turns,
    session_cap,
    surely_fits,
    too_large,
    window_key,
)

_SESSION_KEYS = ("meta", "chain", "msgs", "blobs", "gw", "state", "counts")
_UNAVAILABLE = (rexc.ConnectionError, rexc.TimeoutError, TimeoutError, OSError)
_MAX_NEED_ROUNDS = 4  # a concurrent fork can move the needed index; a few retries suffice


def _esc(value: str) -> str:
    # ``{`` ``}`` would break the hash tag and ``/`` the tenant/session separation
    return value.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace("/", "%2F")


class RedisStore(SessionStore):
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        namespace: str = "fg",
        max_connections: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self._ns = namespace
        self._where = url.split("@")[-1]  # never echo a password in errors
        # One immediate retry replaces a pooled connection that went stale (Redis restarted).
        # Every write is safe to repeat: ingest is idempotent, the CAS scripts recognise
        # their own earlier success, gateway turns carry a token. The overall deadline
        # (asyncio.timeout in _guard) still bounds the call.
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            max_connections=max_connections,
        )
        self._ingest = self._redis.register_script(redis_lua.INGEST)
        self._lookup = self._redis.register_script(redis_lua.LOOKUP)
        self._gateway_turns = self._redis.register_script(redis_lua.GATEWAY_TURNS)
        self._set_assignment = self._redis.register_script(redis_lua.SET_ASSIGNMENT)
        self._count_session = self._redis.register_script(redis_lua.COUNT_SESSION)
        self._count_tenant = self._redis.register_script(redis_lua.COUNT_TENANT)
        self._charge = self._redis.register_script(redis_lua.CHARGE)

    async def _scripts(
        self,
        calls: Sequence[tuple[Any, Sequence[Any], Sequence[Any]]],
        then: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """Scripts (``(script, keys, args)``), then what ``then`` adds to the pipeline, in
        one round trip. By digest (EVALSHA): redis-py's pipelined scripts would first ask
        ``SCRIPT EXISTS`` every time; a script Redis lacks (after a restart) is loaded and
        the round trip repeated, which every script here allows (none wrote anything)."""
        for _ in range(2):
            pipe = self._redis.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            if then is not None:
                then(pipe)
            replies = await pipe.execute(raise_on_error=False)
            if not any(isinstance(r, rexc.NoScriptError) for r in replies):
                for r in replies:
                    if isinstance(r, Exception):
                        raise r
                return replies
            for script, _, _ in calls:
                await self._redis.script_load(script.script)
        raise rexc.NoScriptError("scripts vanished again right after loading them")

    # -- keys --------------------------------------------------------------------------
    def _keys(self, tenant: str, session: str) -> list[str]:
        t, s = _esc(check_id("tenant", tenant)), _esc(check_id("session", session))
        tag = f"{self._ns}:{{{t}/{s}}}"
        return [f"{tag}:{name}" for name in _SESSION_KEYS]

    def _assignment_key(self, tenant: str, session: str) -> str:
        return self._keys(tenant, session)[0][: -len("meta")] + "asg"

    def _tenant_key(self, tenant: str, name: str) -> str:
        """A key under the tenant's own hash tag (its session index, counters, quotas)."""
        return f"{self._ns}:{{t:{_esc(check_id('tenant', tenant))}}}:{name}"

    def _index_key(self, tenant: str) -> str:
        return self._tenant_key(tenant, "sessions")

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    @asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except _UNAVAILABLE as e:
            raise StoreUnavailable(f"redis at {self._where} is unavailable: {e!r}") from e

    # -- history -----------------------------------------------------------------------
    async def ingest(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
        assign: Assign | None = None,
    ) -> IngestResult:
        keys = [*self._keys(tenant, session), self._assignment_key(tenant, session)]
        check_assign(assign)
        prep = self._digests.prepare(tenant, session, messages)
        n = len(prep.packed)
        chains = b"".join(prep.chains)
        # Unknown: assume all of it is stored (a re-send); the script says what it needs.
        start = n if prep.known_stored is None else prep.known_stored
        cap = session_cap(self.max_session_bytes, max_bytes)
        assigning: list[Any] = ["0", "", "0", "", 1]
        if assign is not None:
            assigning = [
                "1",
                assign.replica,
                "0" if assign.expected is None else "1",
                assign.expected or "",
                max(1, int(assign.ttl_s * 1000)),
            ]
        index = self._index_key(tenant)
        async with self._guard():
            for _ in range(_MAX_NEED_ROUNDS):
                args: list[Any] = [*assigning, self._ttl_ms, cap, chains, start, n - start]
                blobs: dict[bytes, bytes] = {}
                for p in prep.packed[start:]:
                    args.append(p.body)
                    for ref, text in p.blobs.items():
                        if ref not in blobs:
                            blobs[ref] = codec.encode_blob(text)
                for ref, data in blobs.items():
                    args += (ref, data)
                # The session index (another hash tag) refreshed in the same round trip.
                reply, _ = await self._scripts(
                    [(self._ingest, keys, args)],
                    lambda pipe: pipe.zadd(index, {session: time.time() * 1000}, xx=True),
                )
                kind = reply[0]
                if kind == b"need":
                    start = int(reply[1])
                    continue
                if kind == b"too_large":
                    raise too_large(tenant, session, int(reply[1]), int(reply[2]), cap)
                self._digests.stored(tenant, session, prep, n)
                if int(reply[3]) == n:
                    # A new session: the index learns it (``xx`` above only refreshed).
                    await self._redis.zadd(index, {session: time.time() * 1000})
                assignment = reply[5].decode() if reply[5] else None
                return IngestResult(
                    int(reply[1]), int(reply[2]), int(reply[3]), bool(reply[4]), assignment
                )
        raise RuntimeError("ingest: the needed suffix kept moving; too many concurrent forks")

    async def lookup(
        self,
        tenant: str,
        session: str,
        messages: Sequence[Message],
        *,
        max_bytes: int | None = None,
    ) -> Lookup:
        keys = [*self._keys(tenant, session), self._assignment_key(tenant, session)]
        prep = self._digests.prepare(tenant, session, messages)
        cap = session_cap(self.max_session_bytes, max_bytes)
        async with self._guard():
            target, stored, parent, asg, flat_counts, flat_turns, size = await self._lookup(
                keys=keys, args=[b"".join(prep.chains)]
            )
            self._digests.stored(tenant, session, prep, int(stored))
            new = prep.packed[int(stored) :]
            if not surely_fits(size, new, cap):
                # Near the cap: count as the ingest script will (only blobs not held yet).
                texts = blob_texts(new)
                pipe = self._redis.pipeline(transaction=False)
                for ref in texts:
                    pipe.hexists(keys[3], ref)
                held = await pipe.execute()
                fresh = {
                    ref: codec.encode_blob(text)
                    for (ref, text), exists in zip(texts.items(), held, strict=True)
                    if not exists
                }
                adding = added_bytes(new, fresh)
                if size + adding > cap:
                    raise too_large(tenant, session, size, adding, cap)
            turns: list[tuple[int, bytes]] = []
            for limit, envelope in zip(flat_turns[::2], flat_turns[1::2], strict=True):
                after, body = codec.unpack(envelope)
                if after < int(limit):
                    turns.append((after, body))
            refs = sorted({r for _, body in turns for r in codec.blob_refs(body)})
            # Restored content is kept as blobs: only a session with restores reads them.
            found = await self._redis.hmget(keys[3], refs) if refs else []
        blobs = dict(zip(refs, found, strict=True))
        owner = int(target) if int(target) >= 0 else int(parent)
        gateway_turns: Mapping[int, tuple[dict[str, Any], ...]] = {}
        if turns:
            branches = {owner: (-1, 0, 0)}
            gateway_turns = assemble(session, owner, branches, [], turns, blobs.get).gateway_turns
        counts = {
            name.decode(): int(value)
            for name, value in zip(flat_counts[::2], flat_counts[1::2], strict=True)
        }
        return Lookup(
            int(target) if int(target) >= 0 else None,
            int(stored),
            gateway_turns,
            counts,
            asg.decode() if asg else None,
        )

    async def load(
        self, tenant: str, session: str, branch: int | None = None, *, messages: bool = True
    ) -> StoredHistory:
        keys = self._keys(tenant, session)
        meta_k, _, msgs_k, blobs_k, gw_k, *_ = keys
        if branch is not None:
            check_branch(branch)
        async with self._guard():
            raw = await self._redis.hgetall(meta_k)
            if not raw:
                raise NotFound(f"no session {session!r} for tenant {tenant!r}")
            meta = {k.decode(): int(v) for k, v in raw.items()}
            b = meta["head"] if branch is None else branch
            if f"l{b}" not in meta:
                raise NotFound(f"session {session!r} has no branch {b}")
            branches = {
                br: (meta[f"p{br}"], meta[f"f{br}"], meta[f"l{br}"]) for br in range(meta["nb"])
            }
            segments = ancestry(branches, b)
            pipe = self._redis.pipeline(transaction=False)
            fields = (
                [f"{s}:{i}" for s, lo, hi in segments for i in range(lo, hi)] if messages else []
            )
            if fields:
                pipe.hmget(msgs_k, fields)
            for s, _, _ in segments:
                pipe.hget(gw_k, f"{s}:n")
            counts = await pipe.execute()
            bodies = counts.pop(0) if fields else []
            if any(body is None for body in bodies):
                raise NotFound(f"session {session!r} was deleted or expired while loading")
            # a fork sees an ancestor's gateway turns that follow a message of the shared part
            owners = [
                (s, hi)
                for (s, _, hi), c in zip(segments, counts, strict=True)
                for _ in range(int(c or 0))
            ]
            turns: list[tuple[int, bytes]] = []
            if owners:
                fields = [
                    f"{s}:{i}"
                    for (s, _, _), c in zip(segments, counts, strict=True)
                    for i in range(int(c or 0))
                ]
                envelopes = await self._redis.hmget(gw_k, fields)
                for (_, limit), env in zip(owners, envelopes, strict=True):
                    after, body = codec.unpack(env)
                    if after < limit:
                        turns.append((after, body))
            refs = sorted(
                {r for body in bodies for r in codec.blob_refs(body)}
                | {r for _, body in turns for r in codec.blob_refs(body)}
            )
            pipe = self._redis.pipeline(transaction=False)
            if refs:
                pipe.hmget(blobs_k, refs)
            self._touch(pipe, tenant, session, keys)
            replies = await pipe.execute()
        blobs = dict(zip(refs, replies[0], strict=True)) if refs else {}
        return assemble(session, b, branches, bodies, turns, blobs.get)

    def _touch(self, pipe: Any, tenant: str, session: str, keys: list[str]) -> None:
        for k in keys:
            pipe.pexpire(k, self._ttl_ms)
        pipe.zadd(self._index_key(tenant), {session: time.time() * 1000}, xx=True)

    async def append_gateway_turns(
        self, tenant: str, session: str, branch: int, after_index: int, messages: Sequence[Message]
    ) -> None:
        keys = self._keys(tenant, session)
        check_branch(branch)
        check_turns(after_index, messages)
        packed = [codec.pack_message(m) for m in messages]
        token = os.urandom(8).hex()
        args: list[Any] = [self._ttl_ms, self.max_session_bytes, branch, after_index, token]
        args.append(len(packed))
        args += [codec.pack([after_index, p.body]) for p in packed]
        blobs = {ref: text for p in packed for ref, text in p.blobs.items()}
        for ref, text in blobs.items():
            args += (ref, codec.encode_blob(text))
        async with self._guard():
            reply = await self._gateway_turns(keys=keys, args=args)
        kind = reply[0]
        if kind == b"no_branch":
            raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
        if kind == b"bad_index":
            raise bad_after_index(after_index, branch, int(reply[1]))
        if kind == b"too_large":
            raise too_large(tenant, session, int(reply[1]), int(reply[2]), self.max_session_bytes)

    # -- counters ----------------------------------------------------------------------
    async def add_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        *,
        token: str,
        latest: Mapping[str, int] | None = None,
        record: bytes | None = None,
    ) -> None:
        keys = self._keys(tenant, session)
        latest = latest or {}
        check_branch(branch)
        check_counts(counts, token, latest)
        pairs = [x for name, value in counts.items() for x in (name, value)]
        sets = [x for name, value in latest.items() for x in (name, value)]
        tenant_keys = [self._tenant_key(tenant, "counts"), self._tenant_key(tenant, f"tok:{token}")]
        token_ttl_ms = int(COUNT_TOKEN_TTL_S * 1000)
        async with self._guard():
            # Two scripts (the session's keys and the tenant's live on different Cluster
            # shards), one round trip.
            session_args = [self._ttl_ms, branch, token, record or b"", len(counts), *pairs, *sets]
            await self._scripts(
                [
                    (self._count_session, keys, session_args),
                    (self._count_tenant, tenant_keys, [token_ttl_ms, *pairs]),
                ]
            )

    async def get_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        keys = self._keys(tenant, session)
        check_branch(branch)
        prefix = f"{branch}:".encode()
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hexists(keys[0], f"l{branch}")
            pipe.hgetall(keys[6])
            exists, raw = await pipe.execute()
        if not exists:
            raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
        return {k[len(prefix) :].decode(): int(v) for k, v in raw.items() if k.startswith(prefix)}

    async def get_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        keys = self._keys(tenant, session)
        check_branch(branch)
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hexists(keys[0], f"l{branch}")
            pipe.hget(keys[5], f"{branch}:rn")
            exists, count = await pipe.execute()
            if not exists:
                raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
            fields = [f"{branch}:r:{i}" for i in range(int(count or 0))]
            records = await self._redis.hmget(keys[5], fields) if fields else []
        return [r for r in records if r is not None]

    async def get_tenant_counts(self, tenant: str) -> dict[str, int]:
        key = self._tenant_key(tenant, "counts")
        async with self._guard():
            raw = await self._redis.hgetall(key)
        return {k.decode(): int(v) for k, v in raw.items()}

    async def charge(
        self,
        tenant: str,
        charges: Sequence[Charge],
        *,
        session: str | None = None,
        max_sessions: int | None = None,
    ) -> Refusal | None:
        now = time.time()
        keys = [self._index_key(tenant)]
        args: list[Any] = [
            check_id("session", session) if session is not None else "",
            -1 if max_sessions is None else max_sessions,
            (now - self.ttl_s) * 1000,
        ]
        for c in charges:
            name, keep_s = window_key(c, now)
            keys.append(self._tenant_key(tenant, f"q:{_esc(check_id('charge', name))}"))
            args += [c.amount, -1 if c.limit is None else c.limit, max(1, int(keep_s * 1000))]
        async with self._guard():
            reply = await self._charge(keys=keys, args=args)
        if reply[0] == b"ok":
            return None
        which, current = int(reply[1]), int(reply[2])
        if which == 0:
            return Refusal("sessions", current, max_sessions or 0)
        refused = charges[which - 1]
        return Refusal(refused.name, current, refused.limit or 0)

    # -- router assignment -------------------------------------------------------------
    async def get_assignment(self, tenant: str, session: str) -> str | None:
        key = self._assignment_key(tenant, session)
        async with self._guard():
            value = await self._redis.get(key)
        return value.decode() if value is not None else None

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        key = self._assignment_key(tenant, session)
        check_id("replica", replica)
        if ttl_s <= 0:
            raise ValueError(f"assignment ttl_s must be positive, got {ttl_s}")
        args = [
            "0" if expected is None else "1",
            expected or "",
            replica,
            max(1, int(ttl_s * 1000)),
        ]
        async with self._guard():
            value = await self._set_assignment(keys=[key], args=args)
        return value.decode()

    # -- kept replies ------------------------------------------------------------------
    def _reply_key(self, tenant: str, reply_id: str) -> str:
        t, r = _esc(check_id("tenant", tenant)), _esc(check_id("reply", reply_id))
        return f"{self._ns}:{{t:{t}}}:reply:{r}"

    async def put_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        key = self._reply_key(tenant, reply_id)
        async with self._guard():
            await self._redis.set(key, data, px=self._ttl_ms)

    async def get_reply(self, tenant: str, reply_id: str) -> bytes | None:
        key = self._reply_key(tenant, reply_id)
        async with self._guard():
            value: bytes | None = await self._redis.get(key)
        return value

    # -- sessions ----------------------------------------------------------------------
    async def list_sessions(self, tenant: str) -> list[str]:
        index = self._index_key(tenant)
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            pipe.zremrangebyscore(index, "-inf", (time.time() - self.ttl_s) * 1000)
            pipe.zrange(index, 0, -1)
            _, names = await pipe.execute()
        return [n.decode() for n in names]

    async def delete_session(self, tenant: str, session: str) -> bool:
        keys = [*self._keys(tenant, session), self._assignment_key(tenant, session)]
        self._digests.forget(tenant, session)
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(*keys)
            pipe.zrem(self._index_key(tenant), session)
            deleted, _ = await pipe.execute()
        return deleted > 0

    async def stored_bytes(self, tenant: str, session: str) -> int:
        """Memory Redis uses for the session's keys (``MEMORY USAGE``): for benchmarks."""
        keys = self._keys(tenant, session)
        async with self._guard():
            sizes = [await self._redis.memory_usage(k, samples=0) for k in keys]
        return sum(s or 0 for s in sizes)

    async def close(self) -> None:
        await self._redis.aclose()
