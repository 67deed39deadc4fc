"""The client dialects, and the codecs they are built from.

A ``Dialect`` (``base``) is one client API: route, request decoding, reply encoding, error
shape. ``DIALECTS`` lists the ones the gateway serves; a new dialect is one module with a
``Dialect`` subclass and one line here. ``openai_chat`` and ``anthropic_messages`` decode
request bodies into the neutral transcript and encode them back losslessly (or into the
other dialect); ``openai_responses`` decodes the Responses API into it and writes its event
stream; ``chunks`` holds the reply side they share (the upstream's chat chunks assembled),
``anthropic_replies`` the chat -> Anthropic reply translation, ``convert`` the cross-dialect
tool / parameter / part conversions, ``volatile`` the request-scoped markers to drop before
digesting history, ``errors`` the error shapes.
"""

from gateway.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.dialects.base import Dialect
from gateway.dialects.openai_chat import OPENAI_CHAT
from gateway.dialects.openai_responses import OPENAI_RESPONSES

DIALECTS: tuple[Dialect, ...] = (OPENAI_CHAT, ANTHROPIC_MESSAGES, OPENAI_RESPONSES)
