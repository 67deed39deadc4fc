"""The ``foldgate`` command line: one click group whose subcommands live with their wing.

Subcommands are imported when they are invoked, not at start: ``foldgate serve`` must not pay
for the offline wing (the simulator, the replay, matplotlib), about a second per start, which
every gateway start of a load experiment and every replica restart in Kubernetes pays.
"""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of the click command.
SUBCOMMANDS = {
    "serve": "gateway.serve:serve",
    "sessions": "gateway.sessions_cli:sessions",
    "keys": "gateway.keys_cli:keys",
    "replay": "offline.replay_cli:replay_command",
    "simulate": "offline.sim.cli:simulate_command",
    "simulate-fit": "offline.sim.calibration_cli:fit_command",
    "simulate-compare": "offline.sim.calibration_cli:compare_command",
    "experiment": "loadtests.experiment:experiment_command",
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when the subcommand is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attribute = SUBCOMMANDS[cmd_name].split(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup)
@click.version_option(package_name="foldgate")
def main() -> None:
    """foldgate: a serving gateway for long-horizon LLM agents (ReFold, CliffCompaction)."""


if __name__ == "__main__":
    main()
