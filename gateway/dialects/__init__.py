"""Request and response codecs for the client dialects.

``openai_chat`` and ``anthropic_messages`` decode request bodies into the neutral
transcript and encode them back losslessly (or into the other dialect); ``convert`` holds
the cross-dialect tool / parameter / part conversions, ``responses`` the reply-side
translation (chat completions and chunk streams to Anthropic), ``volatile`` the
request-scoped markers to drop before digesting history, ``errors`` the error shapes.
"""
