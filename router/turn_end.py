"""Whether a reply ended the agent's turn: what the harness's own loop says without a word.

A tool-calling agent (Claude Code, Codex, the OpenAI and Anthropic agent SDKs, OpenHands
with a person at the keyboard) runs the tools a reply calls and sends the results straight
back: a tool pause, seconds to minutes. A reply that calls no tool ends its loop: the task
is done, or the agent waits for a person's next message, a pause with no bound the
session's tool pauses could size. Only a request that offered tools says so: an agent
whose actions are text (a command in the reply) ends every reply the same way.
"""

from __future__ import annotations


def ends_turn(offered_tools: bool, harness_calls: int, finish_reason: str | None) -> bool:
    """Whether a finished reply ends the agent's turn: the request offered the harness's
    tools, the reply called none of them, and the model stopped on its own (``stop``; a
    reply cut at its token limit may be continued)."""
    return offered_tools and harness_calls == 0 and finish_reason == "stop"
