"""The request path as DESIGN's steps, one small module each, run in order by
``gateway.pipeline``; each hands the next a frozen result:

- ``decode``: the body read within the gateway's limits and decoded in its dialect, only
  what the session's previous request lacked (``Decoded``); ``kept``: the Responses API's
  kept replies it continues.
- ``admit``: the tenant's quotas, a slot before the body is read and the prompt's tokens
  before anything is stored (``Lease``).
- ``ingest``: one store read gives what the request needs (``lookup`` -> ``Ingested``);
  the history is written only once an upstream accepted the request (``store_history`` ->
  ``Stored``).
- ``render`` (``render_call`` calls it): the strategy over the history, with the
  session's renderer cache (``Rendering``).
- ``route``: what the routing policy is told, and the assignment it chose, written back
  with the history.
- ``forward``: the upstream request, failover while nothing reached the client, and the
  overflow ladder when a replica refuses the context as too long (``Opened``).
- ``restore``: the gateway-side restore loop over the reply (``reply_filter``), its own
  state the turns it adds (``Restoring`` -> ``Outcome``).
- ``account``: one counter increment with the request's log record.
- ``reply``: the chunks in the client's dialect, whole or streamed (``Reply``).
"""
