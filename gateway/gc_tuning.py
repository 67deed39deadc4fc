"""The garbage collector's settings for a serving process (uvicorn or a Ray Serve replica).

Two costs of CPython's defaults on the request path (``bench/overhead.py``, 2,450 requests
of a 64-step session up to ~140 KB, SQLite store; collector time read from
``gc.callbacks``):

- A full-size request parses its history into some ten thousand dicts, lists and
  messages, nearly all freed by reference counting once it is answered. With the
  young-generation threshold at 700 allocations (Python 3.11; 2,000 on 3.13) the collector
  ran several times per request, each run walking the request's live parse tree: 546 young
  and 50 middle collections, 557 ms, about 0.23 ms per request.
- The imported modules and the built app (FastAPI, pydantic, the dialects' tables) are
  long-lived objects that every full collection walked again: the longest pause 86 ms,
  which is a p99.

``tune_for_serving`` runs once the app is built: ``gc.freeze`` moves everything alive then
(never garbage) out of the collector's sight, and the young generation is collected after
10,000 net allocations. Same run: 148 young and 13 middle collections, 40 ms; the longest
pause 39 ms (the sessions' caches, which are live data). Cyclic garbage waits a little
longer to be freed: at most those 10,000 objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def tune_for_serving() -> None:
    """Freeze what is alive now out of the collector's sight; collect the young less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
