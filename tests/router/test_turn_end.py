"""A reply ends the agent's turn only where the request offered tools and it called none."""

from __future__ import annotations

from router.turn_end import ends_turn


def test_only_a_tool_calling_agents_reply_without_a_call_that_stopped_ends_its_turn():
    assert ends_turn(True, 0, "stop")
    assert not ends_turn(True, 1, "tool_calls")  # the harness runs it and comes back
    assert not ends_turn(True, 0, "length")  # cut at its limit: the harness may continue
    assert not ends_turn(False, 0, "stop")  # text actions: every reply ends alike
    assert not ends_turn(True, 0, None)  # the stream ended without saying why
