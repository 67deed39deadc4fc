"""What a tool call shows: the file it prints, and a short name to find it by.

ReFold names a step's file lines in its stubs: a call that prints one file with its own
line numbers (``path_from_call``), or without them (``view_from_call``), and a stub names
a step by its call (``describe_producer``) where the model cannot find it by a label.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# A command that prints one file with its own line numbers (so numbers are file lines).
_NUMBERING_COMMAND = re.compile(
    r"(?:^|[\s;&|(])(?:cat\s+(?:-\w++\s++)*-[^\Wn]*+n\w*+|nl(?:\s+-\w+)*)\s++(?:--\s++)?"
    r"([^\s|;&<>'\"`$()]++)\s*(?:$|[|;&)])",
    re.MULTILINE,
)
# A command that prints (part of) one file as is, alone on its line or after `cd dir &&`:
# the printed lines are then known file lines. Anything piped or chained around it is not.
_VIEW_COMMAND = re.compile(
    r"^[ \t]*(?:cd\s+[^\s;&|]+\s*&&\s*)?"
    r"(?:sed\s+-n\s+(['\"]?)(\d+),(\d+)p\1|head\s+(?:-n\s*|-)(\d+)|cat)"
    r"\s+([^\s|;&<>'\"`$()*?-][^\s|;&<>'\"`$()*?]*)[ \t]*$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class FileView:
    """An unnumbered view of ``path`` that a call printed: its content lines are file lines
    ``first_line``, ``first_line + 1``, ... (at most ``line_count`` of them, if known)."""

    path: str
    first_line: int = 1
    line_count: int | None = None


def normalize_path(path: str) -> str:
    path = path.strip().strip("'\"")
    while path.startswith("./"):
        path = path[2:]
    return path


def path_from_call(name: str, arguments: str) -> str | None:
    """The file a tool call displays with its own line numbers, if it clearly does.

    ``file_path``/``path`` arguments (Claude Code Read, OpenHands/SWE-agent editors) or a
    shell command that numbers one file (``cat -n f``, ``nl -ba f | sed -n 5,9p``).
    """
    args, command = call_arguments(arguments)
    for key in ("file_path", "path"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return normalize_path(value)
    return path_from_command(command) if command else None


def path_from_command(command: str) -> str | None:
    """The single file a shell command prints with line numbers (``cat -n``/``nl``)."""
    found = {normalize_path(m.group(1)) for m in _NUMBERING_COMMAND.finditer(command)}
    return found.pop() if len(found) == 1 else None


def view_from_call(name: str, arguments: str) -> FileView | None:
    """The file lines a shell call prints without numbers, if it clearly does."""
    _, command = call_arguments(arguments)
    return view_from_command(command) if command else None


def view_from_command(command: str) -> FileView | None:
    """``sed -n 'a,bp' f``, ``head -n N f`` or ``cat f`` as the command's only output."""
    found = list(_VIEW_COMMAND.finditer(command))
    if len(found) != 1:
        return None
    _, first, last, head, path = found[0].groups()
    if first is not None:
        lo, hi = int(first), int(last)
        return FileView(normalize_path(path), lo, hi - lo + 1) if 1 <= lo <= hi else None
    return FileView(normalize_path(path), 1, int(head) if head is not None else None)


def call_arguments(arguments: str) -> tuple[dict[str, Any], str | None]:
    """A call's JSON arguments and its shell command; non-JSON text is taken as a command."""
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):  # a string of 100,000 "[" is valid JSON text
        return {}, arguments
    if not isinstance(args, dict):
        return {}, None
    command = args.get("command") or args.get("cmd")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    return args, command if isinstance(command, str) else None


def describe_producer(producer: Any) -> str | None:
    """A short, one-line name of the call that produced an output, for the model to find it
    by: the shell command, ``Tool path``, or the tool's name; for text actions (a reply),
    the first line of its last code block, else its last line."""
    if producer is None:
        return None
    if isinstance(producer, str):
        blocks = code_blocks(producer)
        lines = [line.strip() for line in (blocks[-1] if blocks else producer).split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            return None
        text = lines[0] if blocks else lines[-1]
    else:
        args, command = call_arguments(producer.arguments)
        path = args.get("file_path") or args.get("path")
        text = command or (f"{producer.name} {path}" if isinstance(path, str) else producer.name)
    # Long enough to tell calls apart, short because every stub naming the step repeats it.
    text = " ".join(text.split())
    return text if len(text) <= 48 else text[:45] + "..."


def code_blocks(text: str) -> list[str]:
    """What ``re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL)`` finds, by plain search:
    the regex retries from every backtick of an unclosed run (quadratic in it)."""
    blocks = []
    at = 0
    while (fence := text.find("```", at)) != -1:
        newline = text.find("\n", fence + 3)
        close = text.find("```", newline + 1) if newline != -1 else -1
        if close == -1:
            break  # no later fence can open a block either
        blocks.append(text[newline + 1 : close])
        at = close + 3
    return blocks


def text_action(reply: str) -> str | None:
    """A text-action harness's action in a reply: its last code block, stripped (None
    when it has none)."""
    blocks = code_blocks(reply)
    action = blocks[-1].strip() if blocks else ""
    return action or None
