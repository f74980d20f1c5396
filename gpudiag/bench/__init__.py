"""``gd.bench``: hardware ceilings (matmul, memory bandwidth, attention, collectives).

Each benchmark warms up outside the numbers, synchronises the device (CUDA events on a GPU),
keeps the median and IQR of many repetitions, rotates inputs larger than the last-level cache,
never uses zeros, and checks its result against a higher-precision reference. Importing this
package is light: torch, tqdm and plotly load inside the functions.

GPU code paths (CUDA events, pinned memory, NCCL, fp8, flash-attn, Transformer Engine) follow
torch's documented APIs but are untested on a real GPU in this version; on a CPU every
benchmark runs for real.
"""

from __future__ import annotations

from gpudiag.analysis.nccl import (
    CollectiveResult,
    CollectiveRow,
    parse_nccl_tests,
    parse_nccl_tests_all,
)
from gpudiag.bench.collectives import (
    all_gather,
    allreduce,
    reduce_scatter,
    run_collective,
    torchrun_command,
)
from gpudiag.bench.cpu_bf16 import Bf16Speed, cpu_bf16_speed
from gpudiag.bench.gemm import MatmulResult, MatmulRow, matmul
from gpudiag.bench.memory import BandwidthResult, BandwidthRow, bandwidth
from gpudiag.bench.sdpa import AttentionResult, AttentionRow, attention
from gpudiag.bench.timing import Measurement, measure

__all__ = [
    "AttentionResult",
    "AttentionRow",
    "BandwidthResult",
    "BandwidthRow",
    "Bf16Speed",
    "CollectiveResult",
    "CollectiveRow",
    "MatmulResult",
    "MatmulRow",
    "Measurement",
    "all_gather",
    "allreduce",
    "attention",
    "bandwidth",
    "cpu_bf16_speed",
    "matmul",
    "measure",
    "parse_nccl_tests",
    "parse_nccl_tests_all",
    "reduce_scatter",
    "run_collective",
    "torchrun_command",
]
