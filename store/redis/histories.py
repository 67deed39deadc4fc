"""The Redis backend's histories: each write one Lua script (``store.redis.scripts``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from store import codec
from store.assignments import Assign
from store.branches import ancestry, assemble
from store.digests import PackedHistory
from store.errors import NotFound
from store.histories import Histories, IngestResult, Lookup, StoredHistory
from store.redis import scripts
from store.redis.database import RedisDatabase
from store.sizes import added_bytes, bad_after_index, blob_texts, surely_fits, too_large

_MAX_NEED_ROUNDS = 4  # a concurrent fork can move the needed index; a few retries suffice


def _assigning(assign: Assign | None) -> list[Any]:
    """The ingest script's assignment arguments."""
    if assign is None:
        return ["0", "", "0", "", 1]
    expected = "0" if assign.expected is None else "1"
    return ["1", assign.replica, expected, assign.expected or "", max(1, int(assign.ttl_s * 1000))]


class RedisHistories(Histories):
    db: RedisDatabase
    ttl_s: float

    async def store_history(
        self,
        tenant: str,
        session: str,
        history: PackedHistory,
        cap: int,
        assign: Assign | None,
    ) -> IngestResult:
        keys = [*self.db.keys.session(tenant, session), self.db.keys.assignment(tenant, session)]
        n = len(history.packed)
        chains = b"".join(history.chains)
        # Unknown: assume all of it is stored (a re-send); the script says what it needs.
        start = n if history.known_stored is None else history.known_stored
        index = self.db.keys.index(tenant)
        async with self.db.guard():
            for _ in range(_MAX_NEED_ROUNDS):
                args: list[Any] = [*_assigning(assign), self.db.ttl_ms, cap, chains, start]
                args.append(n - start)
                blobs: dict[bytes, bytes] = {}
                for p in history.packed[start:]:
                    args.append(p.body)
                    for ref, text in p.blobs.items():
                        if ref not in blobs:
                            blobs[ref] = codec.encode_blob(text)
                for ref, data in blobs.items():
                    args += (ref, data)
                # The session index (another hash tag) refreshed in the same round trip.
                reply, _ = await self.db.run_scripts(
                    [(scripts.INGEST, keys, args)],
                    lambda pipe: pipe.zadd(index, {session: time.time() * 1000}, xx=True),
                )
                kind = reply[0]
                if kind == b"need":
                    start = int(reply[1])
                    continue
                if kind == b"too_large":
                    raise too_large(tenant, session, int(reply[1]), int(reply[2]), cap)
                self.digest_cache.stored(tenant, session, history, n)
                if int(reply[3]) == n:
                    # A new session: the index learns it (``xx`` above only refreshed).
                    await self.db.client.zadd(index, {session: time.time() * 1000})
                assignment = reply[5].decode() if reply[5] else None
                return IngestResult(
                    int(reply[1]), int(reply[2]), int(reply[3]), bool(reply[4]), assignment
                )
        raise RuntimeError("ingest: the needed suffix kept moving; too many concurrent forks")

    async def find_history(
        self, tenant: str, session: str, history: PackedHistory, cap: int
    ) -> Lookup:
        keys = [*self.db.keys.session(tenant, session), self.db.keys.assignment(tenant, session)]
        async with self.db.guard():
            target, stored, parent, asg, flat_counts, flat_turns, size = await self.db.script(
                scripts.LOOKUP
            )(keys=keys, args=[b"".join(history.chains)])
            self.digest_cache.stored(tenant, session, history, int(stored))
            new = history.packed[int(stored) :]
            if not surely_fits(size, new, cap):
                await self._refuse_over_cap(tenant, session, keys[3], new, size, cap)
            turns: list[tuple[int, bytes]] = []
            for limit, envelope in zip(flat_turns[::2], flat_turns[1::2], strict=True):
                after, body = codec.unpack(envelope)
                if after < int(limit):
                    turns.append((after, body))
            refs = sorted({r for _, body in turns for r in codec.blob_refs(body)})
            # Restored content is kept as blobs: only a session with restores reads them.
            found = await self.db.client.hmget(keys[3], refs) if refs else []
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

    async def _refuse_over_cap(
        self,
        tenant: str,
        session: str,
        blobs_key: str,
        new: Sequence[codec.PackedMessage],
        size: int,
        cap: int,
    ) -> None:
        """Near the cap: count as the ingest script will (only blobs not held yet)."""
        texts = blob_texts(new)
        pipe = self.db.client.pipeline(transaction=False)
        for ref in texts:
            pipe.hexists(blobs_key, ref)
        held = await pipe.execute()
        fresh = {
            ref: codec.encode_blob(text)
            for (ref, text), exists in zip(texts.items(), held, strict=True)
            if not exists
        }
        adding = added_bytes(new, fresh)
        if size + adding > cap:
            raise too_large(tenant, session, size, adding, cap)

    async def load_branch(
        self, tenant: str, session: str, branch: int | None, with_messages: bool
    ) -> StoredHistory:
        keys = self.db.keys.session(tenant, session)
        meta_k, _, msgs_k, blobs_k, gw_k, *_ = keys
        client = self.db.client
        async with self.db.guard():
            raw = await client.hgetall(meta_k)
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
            pipe = client.pipeline(transaction=False)
            fields = (
                [f"{s}:{i}" for s, lo, hi in segments for i in range(lo, hi)]
                if with_messages
                else []
            )
            if fields:
                pipe.hmget(msgs_k, fields)
            for s, _, _ in segments:
                pipe.hget(gw_k, f"{s}:n")
            counts = await pipe.execute()
            bodies = counts.pop(0) if fields else []
            if any(body is None for body in bodies):
                raise NotFound(f"session {session!r} was deleted or expired while loading")
            turns = await self._gateway_turns(gw_k, segments, counts)
            refs = sorted(
                {r for body in bodies for r in codec.blob_refs(body)}
                | {r for _, body in turns for r in codec.blob_refs(body)}
            )
            pipe = client.pipeline(transaction=False)
            if refs:
                pipe.hmget(blobs_k, refs)
            for k in keys:
                pipe.pexpire(k, self.db.ttl_ms)
            pipe.zadd(self.db.keys.index(tenant), {session: time.time() * 1000}, xx=True)
            replies = await pipe.execute()
        blobs = dict(zip(refs, replies[0], strict=True)) if refs else {}
        return assemble(session, b, branches, bodies, turns, blobs.get)

    async def _gateway_turns(
        self, gw_key: str, segments: Sequence[tuple[int, int, int]], counts: Sequence[Any]
    ) -> list[tuple[int, bytes]]:
        """The branch's gateway turns as (after_index, body), ``counts``: each segment's;
        a fork sees an ancestor's turns that follow a message of the shared part."""
        owners = [
            (s, hi)
            for (s, _, hi), c in zip(segments, counts, strict=True)
            for _ in range(int(c or 0))
        ]
        if not owners:
            return []
        fields = [
            f"{s}:{i}"
            for (s, _, _), c in zip(segments, counts, strict=True)
            for i in range(int(c or 0))
        ]
        envelopes = await self.db.client.hmget(gw_key, fields)
        turns: list[tuple[int, bytes]] = []
        for (_, limit), env in zip(owners, envelopes, strict=True):
            after, body = codec.unpack(env)
            if after < limit:
                turns.append((after, body))
        return turns

    async def store_gateway_turns(
        self,
        tenant: str,
        session: str,
        branch: int,
        after_index: int,
        packed: Sequence[codec.PackedMessage],
    ) -> None:
        keys = self.db.keys.session(tenant, session)
        token = os.urandom(8).hex()
        args: list[Any] = [self.db.ttl_ms, self.max_session_bytes, branch, after_index, token]
        args.append(len(packed))
        args += [codec.pack([after_index, p.body]) for p in packed]
        for ref, text in blob_texts(packed).items():
            args += (ref, codec.encode_blob(text))
        async with self.db.guard():
            reply = await self.db.script(scripts.GATEWAY_TURNS)(keys=keys, args=args)
        kind = reply[0]
        if kind == b"no_branch":
            raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
        if kind == b"bad_index":
            raise bad_after_index(after_index, branch, int(reply[1]))
        if kind == b"too_large":
            raise too_large(tenant, session, int(reply[1]), int(reply[2]), self.max_session_bytes)

    async def live_sessions(self, tenant: str) -> list[str]:
        index = self.db.keys.index(tenant)
        async with self.db.guard():
            pipe = self.db.client.pipeline(transaction=False)
            pipe.zremrangebyscore(index, "-inf", (time.time() - self.ttl_s) * 1000)
            pipe.zrange(index, 0, -1)
            _, names = await pipe.execute()
        return [n.decode() for n in names]

    async def page_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> list[tuple[str, float]]:
        # The index scores sessions by last use (ms); equal scores order by name.
        index, client = self.db.keys.index(tenant), self.db.client
        oldest = (time.time() - self.ttl_s) * 1000
        async with self.db.guard():
            if after is None:
                rows = await client.zrevrangebyscore(
                    index, "+inf", oldest, start=0, num=limit, withscores=True
                )
            else:
                used, name = after
                pipe = client.pipeline(transaction=False)
                pipe.zrevrangebyscore(index, used, used, withscores=True)
                pipe.zrevrangebyscore(
                    index, f"({used!r}", oldest, start=0, num=limit, withscores=True
                )
                ties, older = await pipe.execute()
                rows = [r for r in ties if r[0].decode() < name] + older
        return [(n.decode(), float(score)) for n, score in rows[:limit]]

    async def drop_session(self, tenant: str, session: str) -> bool:
        keys = [*self.db.keys.session(tenant, session), self.db.keys.assignment(tenant, session)]
        async with self.db.guard():
            pipe = self.db.client.pipeline(transaction=False)
            pipe.delete(*keys)
            pipe.zrem(self.db.keys.index(tenant), session)
            deleted, _ = await pipe.execute()
        return deleted > 0

    async def stored_bytes(self, tenant: str, session: str) -> int:
        """Memory Redis uses for the session's keys (``MEMORY USAGE``): for benchmarks."""
        keys = self.db.keys.session(tenant, session)
        async with self.db.guard():
            sizes = [await self.db.client.memory_usage(k, samples=0) for k in keys]
        return sum(s or 0 for s in sizes)
