#!/usr/bin/env bash
# One `vllm serve` per GPU (or per group of TP GPUs) on a real GPU machine: the replica pool
# the gateway routes over. Every replica keeps its own prefix cache, which is what sticky
# routing preserves. Runs in the foreground; Ctrl-C / SIGTERM stops every replica.
#
#   deploy/gpu/serve.sh [MODEL]             # default Qwen/Qwen3.6-27B, all GPUs, ports 8000..
#   GPUS=0,1,2,3 TP=2 BASE_PORT=9000 deploy/gpu/serve.sh Qwen/Qwen3.6-27B
#   DRY_RUN=1 deploy/gpu/serve.sh           # print the commands, start nothing
#
# Environment: GPUS (comma list; default: every GPU nvidia-smi lists), TP (GPUs per replica,
# default 1), BASE_PORT (8000), HOST (0.0.0.0), SERVED_NAME (default: MODEL), MAX_MODEL_LEN
# (131072), GPU_MEM_UTIL (0.90), TOOL_PARSER (qwen3_coder), REASONING_PARSER (qwen3; empty
# to disable), VLLM (the vllm command, default `vllm`), LOG_DIR (.foldgate/logs),
# KV_EVENTS_PORT_OFFSET (1000: each replica publishes its KV events on port+offset, as the
# gateway's kv_events_port_offset expects; empty to disable), KV_OFFLOADING_SIZE (GiB of
# CPU KV offload per replica, vLLM --kv-offloading-size; empty: none),
# EXTRA_ARGS (appended to every command line, word-split).
set -euo pipefail
MODEL="${1:-Qwen/Qwen3.6-27B}"
TP="${TP:-1}"
BASE_PORT="${BASE_PORT:-8000}"
HOST="${HOST:-0.0.0.0}"
SERVED_NAME="${SERVED_NAME:-$MODEL}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-131072}"
GPU_MEM_UTIL="${GPU_MEM_UTIL:-0.90}"
TOOL_PARSER="${TOOL_PARSER:-qwen3_coder}"
REASONING_PARSER="${REASONING_PARSER-qwen3}"
VLLM="${VLLM:-vllm}"
LOG_DIR="${LOG_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/.foldgate/logs}"
KV_EVENTS_PORT_OFFSET="${KV_EVENTS_PORT_OFFSET-1000}"
KV_OFFLOADING_SIZE="${KV_OFFLOADING_SIZE:-}"

die() { echo "serve.sh: $*" >&2; exit 1; }

if [ -z "${GPUS:-}" ]; then
  command -v nvidia-smi >/dev/null || die "no nvidia-smi; set GPUS=0,1,... explicitly"
  GPUS="$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)"
fi
IFS=, read -r -a gpu_list <<<"$GPUS"
[[ "$TP" =~ ^[1-9][0-9]*$ ]] || die "TP must be a positive integer, got '$TP'"
[ "${#gpu_list[@]}" -ge "$TP" ] || die "TP=$TP needs at least $TP GPUs, have '${GPUS}'"
[ $(( ${#gpu_list[@]} % TP )) -eq 0 ] || die "${#gpu_list[@]} GPUs do not split into TP=$TP groups"
replicas=$(( ${#gpu_list[@]} / TP ))

pids=()
stop_all() {
  trap - INT TERM EXIT
  [ "${#pids[@]}" -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
}
trap stop_all EXIT
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM

[ -n "${DRY_RUN:-}" ] || mkdir -p "$LOG_DIR"
for (( r = 0; r < replicas; r++ )); do
  devices="$(IFS=,; echo "${gpu_list[*]:$(( r * TP )):$TP}")"
  port=$(( BASE_PORT + r ))
  cmd=("$VLLM" serve "$MODEL"
    --served-model-name "$SERVED_NAME"
    --host "$HOST" --port "$port"
    --tensor-parallel-size "$TP"
    --max-model-len "$MAX_MODEL_LEN"
    --gpu-memory-utilization "$GPU_MEM_UTIL"
    --enable-prefix-caching
    --scheduling-policy priority
    --enable-prompt-tokens-details
    --enable-auto-tool-choice --tool-call-parser "$TOOL_PARSER"
    --disable-uvicorn-access-log)
  [ -z "$REASONING_PARSER" ] || cmd+=(--reasoning-parser "$REASONING_PARSER")
  if [ -n "$KV_EVENTS_PORT_OFFSET" ]; then
    events="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$(( port + KV_EVENTS_PORT_OFFSET ))\",\"topic\":\"kv\"}"
    cmd+=(--kv-events-config "$events")
  fi
  [ -z "$KV_OFFLOADING_SIZE" ] || cmd+=(--kv-offloading-size "$KV_OFFLOADING_SIZE")
  # shellcheck disable=SC2206  # EXTRA_ARGS is meant to be word-split
  cmd+=(${EXTRA_ARGS:-})
  if [ -n "${DRY_RUN:-}" ]; then
    echo "CUDA_VISIBLE_DEVICES=$devices ${cmd[*]}"
    continue
  fi
  log="$LOG_DIR/vllm-gpu-$port.log"
  echo "replica $r: GPUs $devices -> http://$HOST:$port (log $log)"
  CUDA_VISIBLE_DEVICES="$devices" "${cmd[@]}" >"$log" 2>&1 &
  pids+=("$!")
done
[ -n "${DRY_RUN:-}" ] && exit 0
# Stop everything as soon as one replica dies: a pool with a silent hole misleads the router.
wait -n || true
echo "serve.sh: a replica exited; stopping the others" >&2
exit 1
