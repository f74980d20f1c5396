"""Cost of the live monitor on a training loop: CPU step time with the sampler at 10 Hz vs without.

    python benchmarks/monitor_overhead.py [--rounds 12] [--block-s 1.5] [--threads N]

Goal: < 1 % slowdown. Blocks with and without the monitor are interleaved (off/on, then
on/off) so drift on a shared machine hits both sides; each round gives one ratio of median
step times, and the table shows every round plus the median and spread. The monitor samples
what this machine has: NVML GPUs, or the host (psutil) when there is no GPU. The last column,
the sampler thread's own CPU time per second of wall time, is a low-noise bound on its cost
(a loaded machine inflates wall-clock tick times, not CPU time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from gpudiag.monitoring import monitor


def make_step(width: int, batch: int) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.LayerNorm(width)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    return model, step


def block(step: object, seconds: float) -> float:
    """Median step time (s) over a block of about ``seconds``."""
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        step()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block-s", type=float, default=1.5)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    _, step = make_step(args.width, args.batch)
    block(step, 1.0)  # warm-up: allocator, kernels, caches
    probe = monitor(interval=args.interval, display=False)
    source = probe.label
    probe.stop()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; monitor: {source}")
    header = ["round", "off ms", "on ms", "on/off", "ticks", "tick ms", "cpu %"]
    print("  ".join(f"{h:>8}" for h in header))
    ratios, busy = [], []
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        result: dict[str, float] = {}
        ticks, tick_ms, share = 0.0, float("nan"), float("nan")
        for mode in order:
            if mode == "on":
                m = monitor(interval=args.interval, display=False)
                result[mode] = block(step, args.block_s)
                m.stop()
                stats = m.stats()
                ticks, tick_ms = stats["ticks"], stats["mean_tick_ms"]
                # CPU time of the sampler thread itself, per second of wall time.
                share = 100 * stats["sampler_cpu_s"] / args.block_s
                busy.append(share)
            else:
                result[mode] = block(step, args.block_s)
        ratio = result["on"] / result["off"]
        ratios.append(ratio)
        print(
            f"{r:>8}  {result['off'] * 1e3:>8.3f}  {result['on'] * 1e3:>8.3f}  "
            f"{ratio:>8.4f}  {ticks:>8.0f}  {tick_ms:>8.3f}  {share:>8.3f}"
        )
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    median = statistics.median(ratios)
    print(
        f"median slowdown {100 * (median - 1):+.2f} % (IQR {100 * (q[0] - 1):+.2f} % to "
        f"{100 * (q[2] - 1):+.2f} %; goal < 1 %) over {len(ratios)} interleaved rounds"
    )
    print(f"sampler CPU time: median {statistics.median(busy):.3f} % of one core")


if __name__ == "__main__":
    main()
