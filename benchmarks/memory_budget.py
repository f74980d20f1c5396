"""How long ``gd.memory(..., budget=...)`` takes: notebook 03's micro-batched GPT under its budget.

    python benchmarks/memory_budget.py [--runs 2]

Times, in one process and alternating, the two ways of measuring one step under a memory
budget on a warm copy of notebook 03's workload (GPT, seq 512, d_model 128, micro-batch 1 x 8
accumulation steps, a 48 MiB budget):

- together: the budget's per-operator check (torch's MemTracker) inside the profiler that
  records the memory timeline (shapes, stacks, memory events), one step (gpudiag before);
- apart: one step under the budget alone, then one profiled step (what ``gd.memory`` does).

Prints each run and the ratio of the medians. A notebook cell waits this long with a bar.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    import gpudiag as gd
    from gpudiag import workloads
    from gpudiag.experiment.memory_report import _warm_copy
    from gpudiag.profiling.memory import measure_step_timeline
    from gpudiag.profiling.memory_budget import MemoryBudget

    workload = workloads.get("gpt", seq_len=512, batch_size=8, d_model=128)
    fixes = (gd.Fix("batch.size", micro_batch=1, accumulation=8),)
    budget = 48 << 20
    together, apart = [], []
    with _warm_copy(workload, None, fixes) as (arm, track):

        def capped() -> None:
            with MemoryBudget(budget, track=track):
                arm.step()

        for run in range(args.runs):
            start = time.perf_counter()
            measure_step_timeline(capped)
            together.append(time.perf_counter() - start)
            start = time.perf_counter()
            capped()
            measure_step_timeline(arm.step)
            apart.append(time.perf_counter() - start)
            print(f"run {run}: together {together[-1]:6.1f} s   apart {apart[-1]:6.1f} s")
    a, b = statistics.median(together), statistics.median(apart)
    print(f"median: together {a:.1f} s, apart {b:.1f} s: apart is {a / b:.1f}x faster")


if __name__ == "__main__":
    main()
