"""The Redis backend's ledger: counters and logs under the session's tag, the tenant's
counters, quota counters and lease pools under the tenant's. (Stores of earlier versions
counted requests in flight in the quota key ``q:concurrent``: nothing reads it now, and it
expires on its own.)"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from store.errors import NotFound
from store.ledger import (
    COUNT_TOKEN_TTL_S,
    Charge,
    HeldLease,
    LeaseClaim,
    Ledger,
    Refusal,
    window_key,
)
from store.redis import scripts
from store.redis.database import RedisDatabase
from store.redis.keys import esc


class RedisLedger(Ledger):
    db: RedisDatabase
    ttl_s: float

    async def record_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        token: str,
        latest: Mapping[str, int],
        record: bytes | None,
    ) -> None:
        keys = self.db.keys.session(tenant, session)
        pairs = [x for name, value in counts.items() for x in (name, value)]
        sets = [x for name, value in latest.items() for x in (name, value)]
        tenant_keys = [
            self.db.keys.tenant(tenant, "counts"),
            self.db.keys.tenant(tenant, f"tok:{token}"),
        ]
        token_ttl_ms = int(COUNT_TOKEN_TTL_S * 1000)
        session_args = [self.db.ttl_ms, branch, token, record or b"", len(counts), *pairs, *sets]
        async with self.db.guard():
            # Two scripts (the session's keys and the tenant's live on different Cluster
            # shards), one round trip.
            await self.db.run_scripts(
                [
                    (scripts.COUNT_SESSION, keys, session_args),
                    (scripts.COUNT_TENANT, tenant_keys, [token_ttl_ms, *pairs]),
                ]
            )

    async def read_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        keys = self.db.keys.session(tenant, session)
        prefix = f"{branch}:".encode()
        async with self.db.guard():
            pipe = self.db.client.pipeline(transaction=False)
            pipe.hexists(keys[0], f"l{branch}")
            pipe.hgetall(keys[6])
            exists, raw = await pipe.execute()
        if not exists:
            raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
        return {k[len(prefix) :].decode(): int(v) for k, v in raw.items() if k.startswith(prefix)}

    async def read_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        keys = self.db.keys.session(tenant, session)
        async with self.db.guard():
            pipe = self.db.client.pipeline(transaction=False)
            pipe.hexists(keys[0], f"l{branch}")
            pipe.hget(keys[5], f"{branch}:rn")
            exists, count = await pipe.execute()
            if not exists:
                raise NotFound(f"session {session!r} of tenant {tenant!r} has no branch {branch}")
            fields = [f"{branch}:r:{i}" for i in range(int(count or 0))]
            records = await self.db.client.hmget(keys[5], fields) if fields else []
        return [r for r in records if r is not None]

    async def read_tenant_counts(self, tenant: str) -> dict[str, int]:
        key = self.db.keys.tenant(tenant, "counts")
        async with self.db.guard():
            raw = await self.db.client.hgetall(key)
        return {k.decode(): int(v) for k, v in raw.items()}

    async def take_charges(
        self,
        tenant: str,
        charges: Sequence[Charge],
        session: str | None,
        max_sessions: int | None,
        lease: LeaseClaim | None,
    ) -> Refusal | None:
        now = time.time()
        pool = "" if lease is None else lease.name
        keys = [self.db.keys.index(tenant), self.db.keys.leases(tenant, pool)]
        args: list[Any] = [
            "" if session is None else session,
            -1 if max_sessions is None else max_sessions,
            (now - self.ttl_s) * 1000,
            *(("", 0, 0) if lease is None else (lease.lease_id, lease.limit, ms(lease.period_s))),
        ]
        for c in charges:
            name, keep_s = window_key(c, now)
            keys.append(self.db.keys.tenant(tenant, f"q:{esc(name)}"))
            args += [c.amount, -1 if c.limit is None else c.limit, ms(keep_s)]
        async with self.db.guard():
            reply = await self.db.script(scripts.CHARGE)(keys=keys, args=args)
        if reply[0] == b"ok":
            return None
        if reply[0] == b"full" and lease is not None:
            return Refusal(lease.name, int(reply[1]), lease.limit, max(0, int(reply[2])) / 1000)
        which, current = int(reply[1]), int(reply[2])
        if which == 0:
            return Refusal("sessions", current, max_sessions or 0)
        refused = charges[which - 1]
        return Refusal(refused.name, current, refused.limit or 0)

    async def extend_leases(self, leases: Sequence[HeldLease], period_s: float) -> list[HeldLease]:
        pools: dict[tuple[str, str], list[str]] = defaultdict(list)
        for held in leases:
            pools[held.tenant, held.name].append(held.lease_id)
        calls = [
            (scripts.RENEW_LEASES, [self.db.keys.leases(tenant, name)], [ms(period_s), *ids])
            for (tenant, name), ids in pools.items()
        ]
        async with self.db.guard():
            # one script per pool (pools of different tenants live on different Cluster
            # shards), one round trip
            replies = await self.db.run_scripts(calls)
        return [
            HeldLease(tenant, name, lease_id.decode())
            for (tenant, name), lost in zip(pools, replies, strict=True)
            for lease_id in lost
        ]

    async def drop_lease(self, lease: HeldLease) -> None:
        async with self.db.guard():
            await self.db.client.zrem(self.db.keys.leases(lease.tenant, lease.name), lease.lease_id)


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
