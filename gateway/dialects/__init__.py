"""The client dialects, and the codecs they are built from.

A ``Dialect`` (``base``) is one client API: route, request decoding, reply encoding, error
shape. ``DIALECTS`` lists the ones the gateway serves; a new dialect is one module (or
several, split by job) with a ``Dialect`` subclass, and its entry here.

- ``openai_chat``: Chat Completions, decoded into the neutral transcript and encoded back
  losslessly (or from another dialect: what the gateway sends a vLLM upstream);
- ``anthropic_messages``: Anthropic Messages and request encoding, ``anthropic_decode`` its
  request decoding, ``anthropic_replies`` the chat -> Anthropic reply translation;
- ``openai_responses``: the Responses API, ``responses_decode`` its request decoding,
  ``responses_events`` its event stream;
- shared by them: ``fields`` (field checks, hints), ``chunks`` (the upstream's chat chunks
  assembled, SSE framing), ``convert`` (cross-dialect tool / parameter / part
  conversions), ``volatile`` (request-scoped markers to drop before digesting history),
  ``errors`` (the gateway's error and the upstream failures turned into one).

This package imports only the ground floor (``gateway.transcript``, ``gateway.lru``,
``gateway.tokens``).
"""

from gateway.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.dialects.base import Dialect
from gateway.dialects.openai_chat import OPENAI_CHAT
from gateway.dialects.openai_responses import OPENAI_RESPONSES

DIALECTS: tuple[Dialect, ...] = (OPENAI_CHAT, ANTHROPIC_MESSAGES, OPENAI_RESPONSES)
