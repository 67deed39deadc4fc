"""The Redis backend's key names (their layout: ``store.redis.scripts``).

Keys of one session share the hash tag ``{<tenant>/<session>}`` (Cluster-safe) and are
namespaced by tenant; a tenant's session index, counters, quotas and kept replies live
under the tenant's own tag.
"""

from __future__ import annotations

# The keys of one session, in the order the session scripts take them.
SESSION_KEYS = ("meta", "chain", "msgs", "blobs", "gw", "state", "counts")


def esc(value: str) -> str:
    # ``{`` ``}`` would break the hash tag and ``/`` the tenant/session separation
    return value.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace("/", "%2F")


class RedisKeys:
    """Key names under one namespace (``fg`` unless a store is given another)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def session(self, tenant: str, session: str) -> list[str]:
        """The session's keys, ``SESSION_KEYS`` in order."""
        tag = f"{self.namespace}:{{{esc(tenant)}/{esc(session)}}}"
        return [f"{tag}:{name}" for name in SESSION_KEYS]

    def assignment(self, tenant: str, session: str) -> str:
        return f"{self.namespace}:{{{esc(tenant)}/{esc(session)}}}:asg"

    def tenant(self, tenant: str, name: str) -> str:
        """A key under the tenant's own hash tag (its session index, counters, quotas)."""
        return f"{self.namespace}:{{t:{esc(tenant)}}}:{name}"

    def index(self, tenant: str) -> str:
        """The tenant's sessions, scored by when each was last used (ms)."""
        return self.tenant(tenant, "sessions")

    def leases(self, tenant: str, name: str) -> str:
        """The tenant's lease pool ``name``: lease id -> deadline (ms, the server's clock)."""
        return self.tenant(tenant, f"leases:{esc(name)}")

    def reply(self, tenant: str, reply_id: str) -> str:
        return self.tenant(tenant, f"reply:{esc(reply_id)}")
