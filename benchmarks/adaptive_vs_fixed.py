"""Adaptive stopping vs a fixed 100-round protocol on the demo workloads (run on demand).

    python benchmarks/adaptive_vs_fixed.py [--threads 1] [--rounds 100] [--repeats 1]

Target: the adaptive protocol reaches the same verdict as the fixed one in at most 30 % of its
measuring time (the timed rounds; setup, drift check and warm-up are the same for both and are
shown separately). Cases: a clear speedup (GPT bf16), another (GPT eager -> SDPA flash), and a
fix that changes nothing (an attention switch on the MLP).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from gpudiag import workloads
from gpudiag.experiment.compare import compare

CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("gpt bf16", "gpt", {"seq_len": 1024, "batch_size": 2}, "precision.bf16"),
    ("gpt eager->flash", "gpt", {"seq_len": 1024, "batch_size": 2}, "attention.backend=flash"),
    ("mlp attention (no-op)", "mlp", {}, "attention.backend=flash"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=100, help="rounds of the fixed protocol")
    parser.add_argument("--repeats", type=int, default=1, help="repeat each case (different seeds)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {load:.2f}")
    header = [
        "case",
        "seed",
        "adaptive",
        "fixed",
        "same",
        "adaptive s",
        "fixed s",
        "ratio",
        "rounds a/f",
    ]
    rows = []
    for label, name, overrides, fix in CASES:
        for seed in range(args.repeats):
            common = {"progress": False, "seed": seed, "measure_memory": False, "drift_steps": 0}
            a = compare(workloads.get(name, **overrides), [fix], **common)
            f = compare(
                workloads.get(name, **overrides),
                [fix],
                adaptive=False,
                max_rounds=args.rounds,
                **common,
            )
            rows.append(
                [
                    label,
                    str(seed),
                    f"{a.verdict()} {a.speedup()}",
                    f"{f.verdict()} {f.speedup()}",
                    "yes" if a.verdict() == f.verdict() else "NO",
                    f"{a.measuring_s:.1f}",
                    f"{f.measuring_s:.1f}",
                    f"{a.measuring_s / f.measuring_s:.0%}",
                    f"{a.rounds}/{f.rounds}",
                ]
            )
            print("  ".join(rows[-1]), flush=True)
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print()
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    agree = sum(r[4] == "yes" for r in rows)
    worst = max(float(r[7].rstrip("%")) for r in rows)
    print(f"\nsame verdict in {agree}/{len(rows)}; worst adaptive/fixed time ratio {worst:.0f} %")


if __name__ == "__main__":
    main()
