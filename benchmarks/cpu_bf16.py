"""The CPU bf16/fp32 matmul ratio that precision advice reads: its cost, interval and answer.

Measures ``gpudiag.bench.cpu_bf16.measure_bf16_speed()`` several times in one process and
prints each ratio with its interval, the three-way answer (faster / slower / undecided) and
how long it took, then ``gd.bench.matmul`` at the same size for reference (fp32 and bf16
TFLOP/s with the process's own thread count). Every run of one machine should give the same
answer, or "undecided": never "faster" in one run and "slower" in another.

    python benchmarks/cpu_bf16.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    import torch

    from gpudiag.bench.cpu_bf16 import SIZE, measure_bf16_speed
    from gpudiag.bench.gemm import matmul

    torch.ones(2) @ torch.ones(2)  # torch's first-call setup is not the measurement's cost
    ratios, costs, answers = [], [], []
    print(
        f"{'run':>4}  {'bf16/fp32 speed':>15}  {'interval':>20}  {'answer':>9}  {'fp32 ms':>8}  "
        f"{'bf16 ms':>8}  {'took ms':>8}"
    )
    for run in range(args.runs):
        start = time.perf_counter()
        speed = measure_bf16_speed()
        took = (time.perf_counter() - start) * 1e3
        costs.append(took)
        if speed.ratio is None:
            print(f"{run:>4}  not measured: {speed.reason}")
            continue
        ratios.append(speed.ratio)
        answers.append(speed.answer)
        print(
            f"{run:>4}  {speed.ratio:>14.2f}x  {speed.interval:>20}  {speed.answer:>9}  "
            f"{speed.fp32_ms:>8.2f}  {speed.bf16_ms:>8.2f}  {took:>8.0f}"
        )
    if ratios:
        print(
            f"median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max "
            f"{max(ratios):.2f}); median cost {statistics.median(costs):.0f} ms; answers: "
            + ", ".join(f"{a} {answers.count(a)}" for a in sorted(set(answers)))
        )
    reference = matmul(["fp32", "bf16"], sizes=[SIZE], device="cpu", progress=False)
    fp32, bf16 = reference.tflops("fp32"), reference.tflops("bf16")
    if fp32 and bf16:
        print(
            f"gd.bench.matmul {SIZE}^3, {torch.get_num_threads()} threads: fp32 "
            f"{fp32 * 1e3:.1f} GFLOP/s, bf16 {bf16 * 1e3:.1f} GFLOP/s ({bf16 / fp32:.2f}x)"
        )


if __name__ == "__main__":
    main()
