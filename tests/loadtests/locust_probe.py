"""Runs the replay users in-process with Locust's ``Environment`` / ``LocalRunner`` API and
prints every request event Locust saw as JSON (one document on stdout).

A separate process, because importing Locust monkey-patches the standard library with
gevent, which the rest of the test session (asyncio, Ray) must not inherit:

    python -m tests.loadtests.locust_probe --host URL --trajectories F -u 2 \
        --sessions-per-user 1 [replay args]
"""

from __future__ import annotations

import json
import sys
from typing import Any

from locust import events
from locust.argument_parser import parse_options
from locust.env import Environment

from loadtests.locustfile import AgentSession

TIMEOUT_S = 60


def main(argv: list[str]) -> None:
    options = parse_options(argv)
    env = Environment(
        user_classes=[AgentSession], events=events, host=options.host, parsed_options=options
    )
    seen: list[dict[str, Any]] = []

    def on_request(**kw: Any) -> None:
        exc = kw.get("exception")
        seen.append(
            {
                "request_type": kw["request_type"],
                "name": kw["name"],
                "response_time": kw["response_time"],
                "exception": None if exc is None else str(exc),
            }
        )

    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    runner.start(options.num_users, spawn_rate=options.num_users)
    runner.greenlet.join(timeout=TIMEOUT_S)  # the users end the run when all are done
    runner.quit()
    stats = env.stats
    json.dump(
        {
            "events": seen,
            "stats": {
                f"{e.method} {e.name}": {"num_requests": e.num_requests, "failures": e.num_failures}
                for e in stats.entries.values()
            },
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
