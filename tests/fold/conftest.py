"""Small hand-built transcripts for the ReFold tests.

A history is written as turns: one assistant reply and the outputs it produced. In
tool-calling form each output answers a call of the reply; in text-action form the reply
is the action and the single output comes back as a user message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.transcript import Message, Text, ToolCall, Transcript, text_message, tool_message


@dataclass(frozen=True)
class Turn:
    """An assistant reply and the outputs it got back (one per call)."""

    reply: str = ""
    outputs: tuple[str, ...] = ()
    commands: tuple[str, ...] = field(default_factory=tuple)

    def command(self, i: int, default: str = "ls") -> str:
        """The ``i``-th call's command; unnamed ones get ``default`` (a distinct command
        per call by default in the histories below: a command run again supersedes)."""
        return self.commands[i] if i < len(self.commands) else default


def turn(reply: str, *outputs: str, commands: Sequence[str] = ()) -> Turn:
    return Turn(reply, tuple(outputs), tuple(commands))


def tool_history(turns: Sequence[Turn], *, system: str | None = "You are an agent.") -> Transcript:
    """Tool-calling transcript: every output is a ``tool`` message answering its call."""
    messages: list[Message] = []
    if system is not None:
        messages.append(text_message("system", system))
    messages.append(text_message("user", "Fix the bug."))
    counter = 0
    for t in turns:
        calls = []
        for i in range(len(t.outputs)):
            command = t.command(i, f"ls dir{counter}")
            calls.append(ToolCall(f"call_{counter}", "bash", json.dumps({"command": command})))
            counter += 1
        parts: tuple = ((Text(t.reply),) if t.reply else ()) + tuple(calls)
        messages.append(Message("assistant", parts))
        messages.extend(
            tool_message(call.id, out) for call, out in zip(calls, t.outputs, strict=True)
        )
    return Transcript(tuple(messages))


def text_history(turns: Sequence[Turn], *, system: str | None = "You are an agent.") -> Transcript:
    """Text-action transcript: the action is in the reply, the observation a user message."""
    messages: list[Message] = []
    if system is not None:
        messages.append(text_message("system", system))
    messages.append(text_message("user", "Fix the bug."))
    for n, t in enumerate(turns):
        command = t.command(0, f"ls dir{n}")
        action = f"{t.reply}\n```\n{command}\n```" if t.reply else f"```\n{command}\n```"
        messages.append(text_message("assistant", action))
        messages.extend(text_message("user", out) for out in t.outputs)
    return Transcript(tuple(messages))


def protocol(progress: str, stale: str = "-") -> str:
    return f"PROGRESS: {progress}\nSTALE: {stale}"


def numbered(first: int, lines: Sequence[str], style: str = "tab") -> str:
    """A file view of ``lines`` starting at line ``first`` in one harness's format."""
    out = []
    for n, code in enumerate(lines, start=first):
        if style == "tab":
            out.append(f"{n:6d}\t{code}")
        elif style == "arrow":
            out.append(f"{n:6d}→{code}")
        elif style == "colon":
            out.append(f"{n}:{code}")
        else:
            out.append(f"{n}|{code}")
    return "\n".join(out)


def source_lines(count: int, tag: str = "app") -> list[str]:
    """Distinct, realistic-looking code lines (long enough to make spans worth stubbing)."""
    lines = []
    for i in range(count):
        if i % 10 == 0:
            lines.append(f"def {tag}_function_{i}(argument_one, argument_two):")
        else:
            lines.append(f"    value_{i} = compute_{tag}(argument_one, {i}) + argument_two")
    return lines
