"""The bulk of a large request's work, off the event loop.

A request's decode, pack, render and upstream encoding cost time linear in its history, on
the thread that runs it; for a history at the message limit that is seconds when nothing
of it was seen before (a session's first request, a history that does not extend the
last one). On the event loop those seconds would hold every other request. ``Offload``
runs such a step in one worker thread instead (the bound: large requests queue behind
each other, and the loop, which keeps the GIL for most of each switch interval it asks
for, goes on serving the small ones); a small request's step runs inline, where a thread
hop would cost more than the step.

The caches these steps use are shared with the loop's requests: ``gateway.lru.LRU`` locks
its operations. A session's renderer cache is mutated in place by its renderer, so two
renders of one session must not overlap: a step names the session it works on, and a
step of a session that has one in the worker waits for that one (on the loop) first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

# A step is large from this many messages (or conversation items) on, or this many
# estimated tokens of text (~1 MB): below either, it costs a few milliseconds at most.
LARGE_MESSAGES = 1_000
LARGE_TOKENS = 256 * 1024

P = ParamSpec("P")
R = TypeVar("R")


def is_large(messages: int, tokens: int = 0) -> bool:
    """Whether a step over ``messages`` messages holding ``tokens`` estimated tokens is
    worth the worker thread."""
    return messages >= LARGE_MESSAGES or tokens >= LARGE_TOKENS


class Offload:
    """One worker thread for the steps of large requests (see the module doc)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foldgate-bulk")
        self._busy: dict[Hashable, asyncio.Event] = {}

    async def run(
        self,
        large: bool,
        session: Hashable | None,
        step: Callable[P, R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``step(*args, **kwargs)``: in the worker when ``large``, else inline; after the
        step of ``session`` (None: a step that needs no order) the worker runs, if any."""
        if session is not None:
            while (running := self._busy.get(session)) is not None:
                await running.wait()
        if not large:
            return step(*args, **kwargs)
        loop = asyncio.get_running_loop()
        job = self._pool.submit(step, *args, **kwargs)
        if session is not None:
            # Cleared when the thread is done, not when the waiting request is: a client
            # gone leaves the step running, and the session's next step waits for it.
            done = self._busy[session] = asyncio.Event()
            job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done, session, done))
        return await asyncio.wrap_future(job)

    def _done(self, session: Hashable, done: asyncio.Event) -> None:
        if self._busy.get(session) is done:
            del self._busy[session]
        done.set()

    def close(self) -> None:
        """Let the worker finish what it runs; accept nothing more."""
        self._pool.shutdown(wait=False, cancel_futures=True)
