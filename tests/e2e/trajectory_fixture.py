"""A small hand-built tool-using agent trajectory, and the requests a harness would send for it.

A harness re-sends the whole history each step: request ``n`` carries the system prompt, the
task and the first ``n`` recorded steps (assistant tool call + tool result). The trajectory
reads the same files more than once, so ReFold has exact duplicates to stub once they fall
below its chunk boundary. Every text starts with a per-trajectory tag, so prefix-cache counts
on shared replicas belong to the test that made them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Step actions: file reads repeat (a.py three times, b.py twice), and so does a test run.
DEFAULT_PLAN = (
    ("read_file", "src/app/a.py"),
    ("read_file", "src/app/b.py"),
    ("read_file", "src/app/a.py"),
    ("run", "pytest -q tests"),
    ("read_file", "src/app/b.py"),
    ("read_file", "src/app/a.py"),
    ("read_file", "src/app/c.py"),
    ("run", "pytest -q tests"),
    ("read_file", "src/app/d.py"),
    ("run", "git status --short"),
)

TOOLS = (
    {
        "name": "read_file",
        "description": "Read a text file of the repository and return its contents.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Repository path."}},
            "required": ["path"],
        },
    },
    {
        "name": "run",
        "description": "Run a shell command in the repository root and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command."}},
            "required": ["command"],
        },
    },
)


@dataclass(frozen=True)
class Step:
    call_id: str
    tool: str
    arguments: dict[str, str]
    thought: str
    output: str


@dataclass(frozen=True)
class Trajectory:
    tag: str
    system: str
    task: str
    steps: tuple[Step, ...]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": dict(t)} for t in TOOLS]

    def anthropic_tools(self) -> list[dict[str, Any]]:
        return [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in TOOLS
        ]

    def openai_messages(self, upto: int) -> list[dict[str, Any]]:
        """Request ``upto``: system, task, then steps ``0 .. upto-1`` as call + result."""
        self._check(upto)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.task},
        ]
        for step in self.steps[:upto]:
            messages.append(
                {
                    "role": "assistant",
                    "content": step.thought,
                    "tool_calls": [
                        {
                            "id": step.call_id,
                            "type": "function",
                            "function": {
                                "name": step.tool,
                                "arguments": json.dumps(step.arguments),
                            },
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": step.call_id, "content": step.output})
        return messages

    def anthropic_messages(self, upto: int) -> list[dict[str, Any]]:
        """Request ``upto`` in Messages shape (the system prompt goes in ``system``)."""
        self._check(upto)
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.task}]
        for step in self.steps[:upto]:
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": step.thought},
                        {
                            "type": "tool_use",
                            "id": step.call_id,
                            "name": step.tool,
                            "input": step.arguments,
                        },
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": step.call_id, "content": step.output}
                    ],
                }
            )
        return messages

    def _check(self, upto: int) -> None:
        if not 0 <= upto <= len(self.steps):
            raise ValueError(f"upto must lie in 0..{len(self.steps)}, got {upto}")


def source_file(path: str, lines: int) -> str:
    """Deterministic Python-looking text for ``path``: distinct per path, same on every read."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    out = [f'"""Module {path}: helpers for the {stem} service."""', "", "import os", ""]
    for i in range(lines):
        if i % 6 == 0:
            out.append(f"def {stem}_handler_{i}(request, retries={i % 4}):")
        elif i % 6 == 5:
            out.append(f"    return {{'{stem}': {i}, 'path': os.path.join('{stem}', str({i}))}}")
        else:
            out.append(f"    value_{i} = request.get('{stem}_field_{i}', {i * 7}) + retries")
    return "\n".join(out) + "\n"


def command_output(command: str) -> str:
    if command.startswith("pytest"):
        rows = [f"tests/test_mod_{i}.py::test_case_{i} PASSED" for i in range(24)]
        return "\n".join([*rows, "FAILED tests/test_mod_7.py::test_edge - KeyError", "1 failed"])
    return "\n".join(f" M src/app/{name}.py" for name in ("a", "b", "c", "d"))


def make_trajectory(
    tag: str,
    plan: tuple[tuple[str, str], ...] = DEFAULT_PLAN,
    file_lines: int = 60,
    system_filler: int = 0,
) -> Trajectory:
    """A trajectory following ``plan`` (tool, path or command). ``system_filler`` adds that
    many lines of harness instructions to the system prompt (real harnesses send thousands
    of tokens of them), which makes the shared prefix dominate as in real sessions."""
    if not tag:
        raise ValueError("tag must be a non-empty string (it keeps prompts unique per test)")
    steps = []
    for i, (tool, target) in enumerate(plan):
        if tool == "read_file":
            arguments, output = {"path": target}, source_file(target, file_lines)
        elif tool == "run":
            arguments, output = {"command": target}, command_output(target)
        else:
            raise ValueError(f"unknown tool {tool!r} in plan step {i}; expected read_file or run")
        steps.append(
            Step(
                call_id=f"call_{tag[:8]}_{i}",
                tool=tool,
                arguments=arguments,
                thought=f"PROGRESS: step {i}, looking at {target}\nSTALE: -",
                output=output,
            )
        )
    rules = [
        f"Rule {i}: keep edits minimal and explain each change in one line."
        for i in range(system_filler)
    ]
    system = "\n".join([f"[{tag}] You are a careful coding agent with two tools.", *rules])
    task = f"[{tag}] The test tests/test_mod_7.py::test_edge fails with KeyError; fix it."
    return Trajectory(tag=tag, system=system, task=task, steps=tuple(steps))


FIGURES_PATH = Path(__file__).resolve().parents[2] / ".foldgate" / "e2e-figures.json"


def record_figures(name: str, figures: dict[str, Any], path: Path = FIGURES_PATH) -> None:
    """Print measured figures and merge them into ``.foldgate/e2e-figures.json`` (by name)."""
    print(f"\n[e2e figures] {name}: {json.dumps(figures)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
