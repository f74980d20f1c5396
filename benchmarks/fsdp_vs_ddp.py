"""FSDP2 vs DDP per-rank peak memory and throughput on the demo GPT, 2 gloo ranks (on demand).

    python benchmarks/fsdp_vs_ddp.py [--nproc 2] [--rounds 3]

What it checks: `gd.compare(workload, fixes=["fsdp.wrap"], nproc=N)` puts every rank's peak
memory under FSDP below DDP's. Cases: the demo GPT at its defaults (activations dominate:
sequence 1024) and a wider one with a larger vocabulary at sequence 32 (parameters, gradients
and Adam state dominate, which is what FSDP shards). Throughput is the job's (all ranks); on a
CPU FSDP's extra all-gathers usually make it slower.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from gpudiag import workloads
from gpudiag.experiment.compare import compare

CASES: list[tuple[str, dict[str, Any]]] = [
    ("gpt defaults (seq 1024)", {}),
    ("gpt d384 vocab8192 seq32", {"seq_len": 32, "d_model": 384, "vocab_size": 8192}),
]


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {args.nproc} gloo ranks, load {load:.2f}")
    header = ("case", "arm", "peak MiB per rank", "median step", "samples/s", "loss drift")
    rows = []
    for name, overrides in CASES:
        wl = workloads.get("gpt", **overrides)
        c = compare(wl, fixes=["fsdp.wrap"], nproc=args.nproc, rounds=args.rounds)
        for arm in (c.baseline, *c.arms):
            peaks = c.peak_bytes_per_rank(arm.label)  # type: ignore[attr-defined]
            median = arm.step_time.median_s
            sps = arm.samples_per_s
            rows.append(
                (
                    name,
                    arm.label,
                    " / ".join(_mib(p) for p in peaks),
                    "n/a" if median is None else f"{median * 1e3:.0f} ms",
                    "n/a" if sps is None else f"{sps:.1f}",
                    "" if arm.drift is None else str(arm.drift),
                )
            )
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
