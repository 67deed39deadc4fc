"""The replay users of ``loadtests.locustfile`` under a step load, to find the knee.

Locust uses a ``LoadTestShape`` found in the locustfile instead of ``-u``/``-r``, so the
shape lives in its own locustfile:

    locust -f loadtests/step_load.py --host http://127.0.0.1:8080 --headless \\
        --step-users 1,2,4,8,16 --step-seconds 60 --think-time 0 --csv out/steps

Each stage holds its user count for ``--step-seconds``; the run ends after the last stage.
Users added at a stage start new sessions; users removed at a stage stop mid-session.
"""

from __future__ import annotations

from typing import Any

from locust import LoadTestShape, events

from loadtests.locustfile import AgentSession

__all__ = ["AgentSession", "StepLoad"]


@events.init_command_line_parser.add_listener
def add_step_arguments(parser: Any) -> None:
    group = parser.add_argument_group("step load")
    group.add_argument("--step-users", default="1,2,4,8", help="Users at each stage.")
    group.add_argument("--step-seconds", type=float, default=60.0, help="Length of each stage.")


def stages(spec: str) -> list[int]:
    users = [int(u) for u in spec.split(",") if u.strip()]
    if not users or any(u < 1 for u in users):
        raise ValueError(f"--step-users needs positive user counts, got {spec!r}")
    return users


class StepLoad(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        opts = self.runner.environment.parsed_options
        users = stages(opts.step_users)
        stage = int(self.get_run_time() // opts.step_seconds)
        if stage >= len(users):
            return None
        # Spawn a whole stage at once: the stage's start is the same for every user.
        return users[stage], float(max(users))
