"""The serving process's collector settings (``gateway.gc_tuning``), in a fresh interpreter:
they are process-wide, and pytest's own process has them already (``tests/conftest.py``)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.gc_tuning import YOUNG_THRESHOLD, tune_for_serving
app = create_app(GatewayConfig(replicas=("http://127.0.0.1:9",)))
before = gc.get_threshold()
tune_for_serving()
print(before[0], gc.get_threshold()[0], YOUNG_THRESHOLD, gc.get_freeze_count())
"""


def test_serving_freezes_the_built_app_and_collects_the_young_less_often() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    default, tuned, wanted, frozen = map(int, out)
    # CPython's default (700 on 3.11, 2,000 on 3.13) ran several collections per request.
    assert tuned == wanted > default
    # The imports and the app (some 65,000 objects) are out of full collections.
    assert frozen > 20_000
