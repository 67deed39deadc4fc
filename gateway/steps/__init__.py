"""The request path as DESIGN's steps, one small module each, run in order by
``gateway.pipeline``:

- ``ingest``: one store read gives what the request needs (which branch its history lands
  on, the gateway's restore turns in it, the branch's counters, the session's replica);
  the history is written only once an upstream accepted the request (``commit``).
- ``render``: the strategy over the history, with the session's renderer cache.
- ``route``: what the routing policy is told, and the assignment it chose, written back
  with the history.
- ``forward``: the upstream request, failover before the first chunk, and the overflow
  ladder when a replica refuses the context as too long.
- ``restore``: the gateway-side restore loop over the reply.
- ``gateway.accounting``: one counter increment (with the request's log record).
"""
