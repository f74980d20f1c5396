"""What gd.compare says about the demo workloads on this machine (run on demand; prints a table).

    python benchmarks/compare_demo.py [--threads 1] [--seq 1024] [--budget 60] [--skip-compile]

Expected on a CPU with AVX512-BF16: on the demo GPT (fp32, eager attention) at sequence 1024+,
precision.bf16 and attention.backend=flash (eager -> SDPA's CPU flash kernel) are each 'faster'
with a confidence interval above 1; compile is reported as it turns out; an attention switch on
the MLP (which has no attention) is 'no significant difference'. The load average before and
after is printed: on a shared machine the intervals widen and the tables say so.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from gpudiag import workloads
from gpudiag.experiment.compare import Comparison, compare


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "n/a"
    return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _row(case: str, c: Comparison) -> list[list[str]]:
    rows = []
    base = c.baseline
    for arm in c.arms:
        if arm.speedup is None:
            rows.append([case, arm.label, "n/a", arm.error or "not measured", "", "", "", ""])
            continue
        mem_b = base.memory.peak_bytes if base.memory else None
        mem_f = arm.memory.peak_bytes if arm.memory else None
        memory = (
            f"{(mem_b or 0) / 2**20:.0f} -> {(mem_f or 0) / 2**20:.0f} MiB"
            if mem_b and mem_f
            else "n/a"
        )
        first = f"{arm.first_step_s:.1f} s" if arm.first_step_s is not None else ""
        rows.append(
            [
                case,
                arm.label,
                str(arm.speedup),
                arm.verdict or "",
                f"{len(arm.step_time.samples_s)} ({arm.stop_reason})",
                f"{base.step_time.median_s * 1e3:.0f} -> {arm.step_time.median_s * 1e3:.0f} ms "
                f"(IQR {base.step_time.relative_spread:.0%}/{arm.step_time.relative_spread:.0%})",
                memory,
                f"{arm.drift} | first step {first}",
            ]
        )
    for label, why in c.skipped:
        rows.append([case, label, "skipped", why, "", "", "", ""])
    return rows


def _print(rows: list[list[str]]) -> None:
    header = [
        "case",
        "fix",
        "speedup (95% CI)",
        "verdict",
        "rounds",
        "step time",
        "peak memory",
        "drift",
    ]
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--seq", type=int, default=1024, help="GPT sequence length")
    parser.add_argument("--batch", type=int, default=2, help="GPT batch size")
    parser.add_argument("--budget", type=float, default=60.0, help="time budget per comparison (s)")
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {_load()}")
    rows: list[list[str]] = []
    started = time.perf_counter()

    gpt_fixes: list[Any] = ["precision.bf16", "attention.backend=flash"]
    if not args.skip_compile:
        gpt_fixes.append("compile")
    gpt = workloads.get("gpt", seq_len=args.seq, batch_size=args.batch)
    c = compare(gpt, gpt_fixes, time_budget_s=args.budget, progress=False)
    print(c, "\n")
    rows += _row(f"gpt seq {args.seq}", c)

    mlp = workloads.get("mlp")
    c = compare(mlp, ["attention.backend=flash"], time_budget_s=args.budget, progress=False)
    print(c, "\n")
    rows += _row("mlp", c)

    _print(rows)
    print(f"\n{time.perf_counter() - started:.0f} s in all; load average after: {_load()}")


if __name__ == "__main__":
    main()
