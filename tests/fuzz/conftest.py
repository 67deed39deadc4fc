"""Prints the fuzz suite's figures per dialect and backend after the run."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz.test_fuzz import RESULTS

    if not RESULTS:
        return
    terminalreporter.section("fuzz: requests per dialect and store backend")
    for r in RESULTS:
        terminalreporter.write_line(
            f"{r['dialect']:<10} {r['backend']:<7} {r['requests']:>6} requests: "
            f"{r['ok']:>5} ok, {r['4xx']:>5} 4xx ({r['refused_checked']} checked: store "
            f"unchanged), {r['5xx']} 5xx, {r['failures']} failing "
            f"({r['seconds']} s) statuses {r['statuses']}"
        )
