"""What a replica's engine step costs: the model routing prices moves with, and the
cluster simulator advances time with.

One engine step (vLLM v1 schedules one batch per step) takes

    step_s = per_step + per_prefill_token * prefill tokens
             + per_decode_seq * decoding sequences + per_attended_token * attended tokens

where attended tokens are the context lengths of every scheduled sequence (a decode reads
its whole KV cache once per step). Two more terms cover the serving path around the engine:

- ``per_output_token_s``: CPU work per streamed token outside the engine step (vLLM's API
  server detokenizes and frames each token as an SSE event, the gateway relays it, the
  client parses it). Where those processes share the engine's cores (vLLM-CPU on a small
  machine) every token emitted in a step lengthens that step, so it is added to the step per
  token emitted; where the frontend has cores of its own (a GPU host) it is 0.
- ``per_request_s``: latency from the client's send to the engine's waiting queue, taking
  no engine time (the gateway's render and routing, HTTP, the API server's chat template
  and tokenization).

``step_jitter`` is how much real step times wander around the model: the log-space
standard deviation of a request's measured decode stretch over the model's prediction
(``simulate-fit --experiment``). Where a replica shares its cores with other processes the
engine's speed changes with what they are doing, so the simulator draws a speed factor
(lognormal, mean 1) for a replica each time its batch changes and keeps it while the batch
stays. 0 is a deterministic replica.

Presets:

- ``cpu-tiny``: the random-weight tiny model of ``deploy/cpu`` on vLLM-CPU, one core per
  replica. The engine terms are fitted by ``foldgate simulate-fit`` from probes it makes
  against a live replica, the serving-path terms by ``foldgate simulate-fit --experiment``
  from a Locust experiment's request log (the figures below are those commands' output on
  this workplace's 2-core machine).
- ``cpu-tiny-loaded``: the same replicas as the pressure profile runs them, two on a 2-core
  machine beside the gateway, Locust and other work (load average 5-15): one uncached token
  costs ~20x what ``cpu-tiny``'s probes of a replica alone on a core measured, which is
  what a session whose prefix was evicted pays to bring it back there.

A replica with vLLM's CPU KV offload tier (``--kv-offloading-size``, ``offload_tokens`` of
it) copies blocks it evicts to host memory and loads them back on a hit there: bringing an
evicted prefix back costs ``reload_s`` (its KV bytes over the host link,
``offload_bytes_per_s``) instead of ``prefill_s``; ``restore_s`` is the cheaper of the two
for what the tier can hold.

- ``h200-qwen3.6-27b``: one H200 serving Qwen3.6-27B in bf16, derived from the hardware
  and model figures cited beside each number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class CostModel:
    name: str
    per_step_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_attended_token_s: float
    # The engine this cost describes (the simulator's replica shape).
    kv_bytes_per_token: int
    kv_pool_tokens: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    # The serving path around the engine (module docstring).
    per_output_token_s: float = 0.0
    per_request_s: float = 0.0
    step_jitter: float = 0.0
    # The CPU offload tier: its size (0: none) and the host link's bytes per second.
    offload_tokens: int = 0
    offload_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        costs = (
            self.per_step_s,
            self.per_prefill_token_s,
            self.per_decode_seq_s,
            self.per_attended_token_s,
            self.per_output_token_s,
            self.per_request_s,
            self.step_jitter,
            self.offload_bytes_per_s,
        )
        if any(c < 0 or not math.isfinite(c) for c in costs):
            raise ValueError(f"cost model {self.name!r}: coefficients must be finite and >= 0")
        if min(self.kv_pool_tokens, self.block_size, self.max_num_batched_tokens) < 1:
            raise ValueError(f"cost model {self.name!r}: pool, block and budget must be >= 1")
        if self.max_num_seqs < 1 or self.kv_bytes_per_token < 1:
            raise ValueError(f"cost model {self.name!r}: max_num_seqs and KV bytes must be >= 1")

    def step_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        attended_tokens: int,
        emitted_tokens: int | None = None,
    ) -> float:
        """One engine step; ``emitted_tokens`` (streamed to clients in this step) defaults
        to one per decoding sequence."""
        emitted = decode_seqs if emitted_tokens is None else emitted_tokens
        return (
            self.per_step_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_seq_s * decode_seqs
            + self.per_attended_token_s * attended_tokens
            + self.per_output_token_s * emitted
        )

    def prefill_s(self, tokens: int) -> float:
        """Time to prefill ``tokens`` at the budget-sized chunks the engine runs them in."""
        if tokens <= 0:
            return 0.0
        steps = math.ceil(tokens / self.max_num_batched_tokens)
        return steps * self.per_step_s + tokens * self.per_prefill_token_s

    def reload_s(self, tokens: int) -> float:
        """Time to load ``tokens`` of KV back from the CPU offload tier (inf without one)."""
        if tokens <= 0:
            return 0.0
        if self.offload_tokens <= 0 or self.offload_bytes_per_s <= 0:
            return math.inf
        return tokens * self.kv_bytes_per_token / self.offload_bytes_per_s

    def restore_s(self, tokens: int) -> float:
        """What bringing an evicted prefix of ``tokens`` back costs: a reload from the
        offload tier for the part it holds (when cheaper than recomputing it), a prefill
        for the rest."""
        kept = min(max(tokens, 0), self.offload_tokens)
        return min(self.prefill_s(tokens), self.reload_s(kept) + self.prefill_s(tokens - kept))

    def with_offload(self, offload_bytes: int) -> CostModel:
        """This engine with a CPU offload tier of ``offload_bytes`` (0: none)."""
        return replace(self, offload_tokens=max(0, offload_bytes) // self.kv_bytes_per_token)

    @property
    def kv_pool_blocks(self) -> int:
        return self.kv_pool_tokens // self.block_size

    def with_pool(self, kv_pool_tokens: int) -> CostModel:
        return replace(self, kv_pool_tokens=kv_pool_tokens)


# H200: 141 GB HBM3e at 4.8 TB/s, 989 TFLOPS dense BF16 (NVIDIA H200 Tensor Core GPU
# datasheet, nvidia.com/en-us/data-center/h200). Qwen3.6-27B: 27B parameters in bf16 =
# 54 GB of weights (model card); 65,536 KV bytes per token in its 16 full-attention layers
# (offline/replay.py's MODEL_KV_BYTES_PER_TOKEN, with the derivation and sources).
_H200_BYTES_PER_S = 4.8e12
_H200_FLOPS = 989e12
_QWEN36_27B_PARAMS = 27e9
_QWEN36_27B_KV_BYTES = 16 * 4 * 256 * 2 * 2
# Assumed, not measured: 50% of peak FLOPs in prefill (typical of bf16 GEMMs at these
# shapes), and vLLM's default gpu_memory_utilization 0.9 with ~6 GB for activations and
# CUDA graphs: (141 * 0.9 - 54 - 6) GB of KV.
_PREFILL_MFU = 0.5
_KV_POOL_BYTES = 141e9 * 0.9 - 2 * _QWEN36_27B_PARAMS - 6e9

PRESETS: dict[str, CostModel] = {
    "h200-qwen3.6-27b": CostModel(
        name="h200-qwen3.6-27b",
        # A decode step reads every weight once: 54 GB / 4.8 TB/s = 11.25 ms, plus ~1.5 ms of
        # scheduling and sampling per step.
        per_step_s=2 * _QWEN36_27B_PARAMS / _H200_BYTES_PER_S + 1.5e-3,
        # 2 FLOPs per parameter per token at 50% MFU: 109 us/token, ~9.2k tokens/s.
        per_prefill_token_s=2 * _QWEN36_27B_PARAMS / (_H200_FLOPS * _PREFILL_MFU),
        # Sampling and bookkeeping per sequence (assumed).
        per_decode_seq_s=2e-5,
        # Each attended token's K and V are read once per step: 64 KiB / 4.8 TB/s.
        per_attended_token_s=_QWEN36_27B_KV_BYTES / _H200_BYTES_PER_S,
        kv_bytes_per_token=_QWEN36_27B_KV_BYTES,
        kv_pool_tokens=int(_KV_POOL_BYTES // _QWEN36_27B_KV_BYTES),
        # vLLM's GPU defaults: block size 16; the API server's defaults on 70-160 GB GPUs
        # other than A100 are max_num_batched_tokens 8192 and max_num_seqs 1024
        # (vllm/engine/arg_utils.py, _set_default_max_num_seqs_and_batched_tokens, 0.32.0).
        block_size=16,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        # The offload tier's host link: PCIe Gen5 x16 is 64 GB/s each way; ~50 GB/s of it
        # in bulk block copies (assumed). A 32k-token prefix (2 GiB) reloads in ~43 ms
        # against ~3.6 s of prefill.
        offload_bytes_per_s=50e9,
    ),
    # Fitted by `foldgate simulate fit` (see offline/sim/calibrate.py) against one
    # deploy/cpu replica: 2 layers, 1 KV head of 64 dims in bf16 = 512 KV bytes per
    # token (deploy/cpu/build_model.py); --kv-cache-memory-bytes 256M; block size 32 as
    # deploy/cpu starts it; vLLM's CPU API-server defaults max_num_batched_tokens 2048 and
    # max_num_seqs 128 (same function of vllm/engine/arg_utils.py).
    "cpu-tiny": CostModel(
        name="cpu-tiny",
        # `foldgate simulate-fit` on 2026-11-30, one replica on one core of the shared
        # 2-core machine (other jobs running): 11 probe phases, fit within ~25% each.
        per_step_s=0.015,
        per_prefill_token_s=2.38e-5,
        per_decode_seq_s=1.01e-3,
        per_attended_token_s=7.19e-8,
        kv_bytes_per_token=2 * 1 * 64 * 2 * 2,
        kv_pool_tokens=256 * 1024 * 1024 // (2 * 1 * 64 * 2 * 2),
        block_size=32,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        # `foldgate simulate-fit --experiment` over the Locust quick profile run on an idle
        # machine (2026-12-01 02:32, /tmp/locust-w/quick-idle1, 280 requests through the
        # gateway; load average 0.6 at its start): 2 replicas, their API servers, the
        # gateway and Locust on 2 cores. Runs beside other work fit 51-69 ms, 252-368 ms
        # and 0.32-0.42: these terms follow the machine's load (module docstring).
        per_output_token_s=0.0435,
        per_request_s=0.225,
        # The same command's spread of those requests' decode stretches around the fitted
        # model.
        step_jitter=0.40,
        # A CPU replica's "offload" is a memcpy within host memory (assumed ~10 GB/s).
        offload_bytes_per_s=10e9,
    ),
}
# The pressure profile's replicas (loadtests/experiments.toml): the 2026-12-02 runs measured
# a 3k-token re-prefill at ~1 s of client TTFT and a 6k one at 4-6 s (per_request_s
# 0.225 s of it), 0.26 and 0.8 ms per uncached token; the middle of the two, against
# cpu-tiny's 24 us (42 us measured on an idle replica, 2026-12-01). What admission prices
# a restore with there (router.working_set.early_at).
PRESETS["cpu-tiny-loaded"] = replace(
    PRESETS["cpu-tiny"], name="cpu-tiny-loaded", per_prefill_token_s=5e-4
)


def get_preset(name: str) -> CostModel:
    if name not in PRESETS:
        raise ValueError(f"unknown cost preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
