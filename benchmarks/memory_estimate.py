"""Estimated vs measured peak memory of one training step on the demo workloads (on demand).

    python benchmarks/memory_estimate.py [--quick]

For the demo GPT, MLP and CNN at three batch sizes each, in fp32 and bf16 autocast, with and
without activation checkpointing: ``gd.estimate_memory`` (the step traced on fake tensors,
nothing allocated) against the peak measured by running the step on this machine (torch's
profiler memory events, categorised; parameters and optimizer state included). Target: within
15 % of the measurement. A case a fix cannot take (checkpointing a model without repeated
blocks) is printed as N/A with the reason.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.estimate import estimate_memory, memory_fixes
from gpudiag.experiment.memory_report import measure_timeline
from gpudiag.units import format_bytes

CASES: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("gpt", {"seq_len": 512}, (1, 2, 4)),
    ("mlp", {}, (64, 256, 1024)),
    ("cnn", {}, (16, 32, 64)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one batch size per model")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{'model':<5} {'batch':>5} {'precision':<9} {'ckpt':<4} {'estimate':>12} "
        f"{'measured':>12} {'error':>7}  {'est s':>5}"
    )
    errors: list[float] = []
    for name, overrides, sizes in CASES:
        workload = workloads.get(name, **overrides)
        for batch in sizes[1:2] if args.quick else sizes:
            for precision in (None, "bf16"):
                for ckpt in (False, True):
                    label = (
                        f"{name:<5} {batch:>5} {precision or 'fp32':<9} {'on' if ckpt else '-':<4}"
                    )
                    try:
                        t0 = time.perf_counter()
                        est = estimate_memory(
                            workload, batch_size=batch, precision=precision, checkpointing=ckpt
                        )
                        took = time.perf_counter() - t0
                        fixes = memory_fixes(precision, ckpt)
                        measured = measure_timeline(workload, batch_size=batch, fixes=fixes)
                    except GpuDiagError as exc:
                        print(f"{label} N/A: {str(exc).split(':')[0]}")
                        continue
                    err = (est.peak_bytes - measured.peak_bytes) / measured.peak_bytes
                    errors.append(abs(err))
                    print(
                        f"{label} {format_bytes(est.peak_bytes):>12} "
                        f"{format_bytes(measured.peak_bytes):>12} {err:>+7.1%}  {took:>5.1f}"
                    )
    if errors:
        within = sum(e <= 0.15 for e in errors)
        print(
            f"\n{within}/{len(errors)} cases within 15 %; worst {max(errors):.1%}, "
            f"median {sorted(errors)[len(errors) // 2]:.1%}"
        )


if __name__ == "__main__":
    main()
