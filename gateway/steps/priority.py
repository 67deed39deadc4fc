"""Priority: the vLLM ``priority`` the gateway sends with an upstream request.

vLLM runs lower values first under ``--scheduling-policy priority`` (its waiting queue is
ordered by (priority, arrival); when the KV pool runs out it preempts the running request
of the highest value). A replica on the default fcfs policy accepts the field and ignores
it (vLLM 0.32: the API server passes it to the engine, whose fcfs queue never reads it;
nothing validates it), so sending it to a mixed pool is harmless.

A continuing session whose prefix is warm on its replica (``WARM``) runs ahead of a cold
start (``COLD``): its prefill is a few blocks, and running it first frees its blocks
sooner; a cold start's long prefill would otherwise evict what the warm one needs. The
tenant's ``priority`` (``tenants.<id>.priority``, lower first, default 0) orders first:
``tenant * CLASSES + class``. A tenant whose ``upstream_fields`` allow ``priority`` may send
its own value in place of its configured one.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from gateway import metrics

WARM = 0
COLD = 1
CLASSES = 2
FIELD = "priority"


def upstream_priority(tenant_priority: int, warm: bool) -> int:
    """The value sent: the tenant's priority first, the session's warmth within it."""
    return tenant_priority * CLASSES + (WARM if warm else COLD)


def tenant_base(body: Mapping[str, Any], configured: int | None) -> int:
    """The tenant's part: the client's own ``priority`` where it survived the tenant's
    scoping of the upstream body (its ``upstream_fields`` allow it), else the configured
    one (0 unset)."""
    sent = body.get(FIELD)
    if isinstance(sent, int) and not isinstance(sent, bool):
        return sent
    return configured or 0


def set_priority(body: MutableMapping[str, Any], priority: int, warm: bool) -> None:
    """Put ``priority`` in the upstream body, counted by class."""
    body[FIELD] = priority
    metrics.UPSTREAM_PRIORITY.labels("warm" if warm else "cold").inc()
