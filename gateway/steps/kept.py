"""Kept replies (the Responses API's ``previous_response_id``): the reply step keeps a
finished reply under its id with where its conversation lives; the decode step reads it
back for a request that continues it."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from gateway.dialects.errors import DialectError
from gateway.steps.ingest import Ingested, Stored
from gateway.transcript import Message
from store import NotFound, SessionStore
from store.checks import check_id


async def remember_reply(
    store: SessionStore, ingested: Ingested, stored: Stored, reply_id: str, reply: Sequence[Message]
) -> None:
    """Keep ``reply`` (the messages the client would send back for it) under
    ``reply_id``, with where its conversation lives, for requests that continue it."""
    record = {
        "session": ingested.session,
        "branch": stored.branch,
        "length": len(ingested.transcript.messages),
        "reply": [m.to_dict() for m in reply],
    }
    await store.put_reply(ingested.tenant, reply_id, orjson.dumps(record))


async def kept_conversation(
    store: SessionStore, tenant: str, reply_id: str
) -> tuple[str, list[Message]]:
    """The session of a kept reply and its conversation up to and including the reply."""
    try:
        check_id("response id", reply_id)
    except ValueError as exc:  # the store keeps no reply under such an id, nor looks one up
        raise DialectError(
            str(exc), param="previous_response_id", code="previous_response_not_found"
        ) from exc
    data = await store.get_reply(tenant, reply_id)
    if data is None:
        raise DialectError(
            f"no kept response {reply_id!r} (never stored, created with store=false, or expired)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    record = orjson.loads(data)
    try:
        history = await store.load(tenant, record["session"], record["branch"])
    except NotFound as exc:
        raise DialectError(
            f"the conversation of response {reply_id!r} has expired",
            param="previous_response_id",
            code="previous_response_not_found",
        ) from exc
    kept = [Message.from_dict(m) for m in history.messages[: record["length"]]]
    kept += [Message.from_dict(m) for m in record["reply"]]
    return record["session"], kept
