"""ReFold's restore: giving the model back the original bytes of steps it cannot see.

The gateway offers a ``restore`` tool (or, in text harnesses, answers a ``restore N``
command block: ``text_restore``, the one reader of it, used by the reply filter as the
reply streams and by ReFold to count what a restore undid), reads the steps from the
history (never from a rendering) and appends the answer as a new turn, listed in
``RenderState.restored`` so that it renders verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.fold.renderer import RenderState, step_indices
from gateway.tokens import TokenCount
from gateway.transcript import Transcript, text_message, tool_name

RESTORE_TOOL_NAME = "restore"
# The names the gateway's tool takes when a harness has a tool of its own by that name.
_CLASH_PREFIX = "foldgate_restore"

_SPEC = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
# ``\s`` takes newlines: one ``\s*`` per gap (``\s*\n?\s*`` matched the same, in time
# quadratic in a run of blanks).
_RESTORE_BLOCK = re.compile(
    r"^\s*```[a-z]*\s*restore\s+(\d+(?:\s*-\s*\d+)?)\s*```\s*$", re.IGNORECASE
)


def text_restore(held: str) -> str | None:
    """The step spec when ``held`` is one command block holding only ``restore N`` / ``i-j``."""
    match = _RESTORE_BLOCK.match(held)
    return re.sub(r"\s+", "", match.group(1)) if match else None


def parse_restore_spec(spec: str) -> tuple[int, int]:
    """``"5"`` -> (5, 5); ``"3-7"`` -> (3, 7). Anything else raises a ValueError saying why."""
    if not isinstance(spec, str):
        raise ValueError(f"restore steps must be a string like '5' or '3-7', got {spec!r}")
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(
            f"cannot read restore steps {spec!r}: expected one step number ('5') or a range ('3-7')"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else first
    if last < first:
        raise ValueError(f"restore range {spec!r} ends (step {last}) before it starts ({first})")
    return first, last


def restore_outputs(
    history: Transcript, state: RenderState | None, first: int, last: int
) -> list[tuple[int, str]]:
    """(step, original output text) for steps ``first..last``, byte-exact from the history."""
    if last < first:
        raise ValueError(f"restore range ends (step {last}) before it starts ({first})")
    steps = step_indices(history, state)
    for step in (first, last):
        if not 0 <= step < len(steps):
            known = f"steps 0-{len(steps) - 1}" if steps else "no steps yet"
            raise ValueError(f"step {step} does not exist (this session has {known})")
    return [(n, history.messages[steps[n]].text) for n in range(first, last + 1)]


def restore_tool_name(tools: Sequence[Mapping[str, Any]]) -> str:
    """The name of the gateway's restore tool beside the harness's ``tools``: ``restore``,
    or, when the harness has a tool of that name, the first free ``foldgate_restore``,
    ``foldgate_restore_2``, ...: a harness's own tool is never answered by the gateway."""
    taken = {tool_name(tool) for tool in tools}
    if RESTORE_TOOL_NAME not in taken:
        return RESTORE_TOOL_NAME
    name, n = _CLASH_PREFIX, 1
    while name in taken:
        n += 1
        name = f"{_CLASH_PREFIX}_{n}"
    return name


def restore_tool_schema(name: str = RESTORE_TOOL_NAME) -> dict[str, Any]:
    """The OpenAI-style function schema of the tool the gateway adds for ReFold."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Show again the original, complete output of earlier steps that appear "
                "folded or as a '[duplicate of step N ...]' stub. The output is added as a "
                "new message; nothing else changes."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "steps": {
                        "type": "string",
                        "description": "One step number ('5') or an inclusive range ('3-7').",
                    }
                },
                "required": ["steps"],
                "additionalProperties": False,
            },
        },
    }


def restore_tool_tokens(count_tokens: TokenCount, name: str = RESTORE_TOOL_NAME) -> int:
    """What the restore tool's schema adds to the prompt, in ``count_tokens`` units."""
    schema = json.dumps(restore_tool_schema(name), separators=(",", ":"))
    empty = count_tokens(text_message("system", ""))
    return max(0, count_tokens(text_message("system", schema)) - empty)
