"""Per-step cost of gpudiag's Step against a hand-written training loop (run on demand).

    python benchmarks/step_overhead.py [--steps 2000] [--repeats 5] [--threads 1]

Target: the Step adds at most a few microseconds of Python per step over the plain loop it
replaced (forward, loss, backward, optimizer step, zero_grad), so trial timings of fast steps
are not changed by it. A tiny model on the CPU makes the Python part dominate; the figure is
the best of ``--repeats`` runs of ``--steps`` steps each.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpudiag.step import Step, Workload


def workload(batch_size: int) -> Workload:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch_size, 16, generator=g), torch.randn(batch_size, 1, generator=g)

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return (model(batch[0]) - batch[1]).square().mean()

    return Workload(
        nn.Linear(16, 1),
        batch=(x, y),
        loss=loss,
        optimizer=lambda p: torch.optim.SGD(p, lr=1e-3),
        batch_size=batch_size,
    )


def hand_written(wl: Workload) -> Callable[[], None]:
    model, batch, loss_fn = wl.model, wl.make_batch(), wl.loss_fn()
    assert wl.optimizer_factory is not None
    optimizer = wl.optimizer_factory(model.parameters())

    def step() -> None:
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def with_step(wl: Workload, accumulation: int = 1) -> Callable[[], Any]:
    training = Step.of(wl)
    training.accumulation = accumulation
    if accumulation > 1:
        training.micro_batch = wl.batch_size // accumulation
    training.new_optimizer()
    return training.run


def best_us(step: Callable[[], Any], steps: int, repeats: int) -> float:
    for _ in range(20):
        step()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - t0) / steps)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        ("hand-written loop", best_us(hand_written(workload(8)), args.steps, args.repeats)),
        ("Step.run", best_us(with_step(workload(8)), args.steps, args.repeats)),
        ("Step.run, 2 micro-batches", best_us(with_step(workload(8), 2), args.steps, args.repeats)),
    ]
    base = rows[0][1]
    print(f"{'step':<28} {'us/step':>9} {'vs loop':>9}")
    for name, us in rows:
        print(f"{name:<28} {us:9.1f} {us - base:+9.1f}")


if __name__ == "__main__":
    main()
