"""gd.tune against the best single fix and an exhaustive search, on planted problems (a table).

    python benchmarks/tune_search.py [--budget 120] [--cases loader_batch,loader_batch_chain]

Each case is a workload with two or more planted problems that runs on this CPU:

- ``loader_batch``: the ``input_bound`` demo at batch 4 (a DataLoader with num_workers=0 and
  heavy per-sample work, and a tiny batch);
- ``loader_batch_chain``: the same input pipeline and batch, and a model whose forward is a
  chain of small element-wise operations (what torch.compile fuses).

For each case, in one run: ``gd.tune`` (its candidates come from the diagnosis and the
workload); an exhaustive search over the same candidates (every subset with one value per
fix, all in one ``gd.compare``), which also measures each single fix; then one head-to-head
``gd.compare`` of tune's best, the exhaustive search's best and the best single fix, so the
three speedups in the table come from the same interleaved rounds. The claim checked: tune's
best is at least as fast as the best single fix, within 5 % of the exhaustive search's best,
in at most a third of its time. The load average is printed: the machine is shared.

Measured on the 2-core shared development machine (load average 8.3 on 2 cores, other
engineers' test suites running; gpudiag 0f59b7a, ``--budget 150``), ``loader_batch``: tune
153.6 s (2.4 % over its budget), best ``batch.size=32`` (race: 3.56x, 98 % CI 1.29-8.06x);
the exhaustive search over the same 6 candidates (23 arms) 494.8 s, best
``dataloader.tuning:num_workers=1+batch.size=32``; the best single fix was ``batch.size=32``,
the arm tune kept. Head to head: tune's best 2.64x (95 % CI 0.92-5.18x, undecided),
exhaustive 3.95x (1.63-8.06x): tune at 0.67 of the exhaustive best, in 0.31 of its time.
Its re-diagnosis had named the next bottleneck (the DataLoader, 56 % of the step) and the
fix, with 4 s of budget left to combine it (reordered since: re-diagnosis now comes before
re-racing undecided fixes). ``loader_batch_chain``: tune's race got 3 rounds in its budget at
that load (nothing decided); its exhaustive search was stopped unfinished.
Second run, ``loader_batch`` only (gpudiag f9e8560, load 3.2 -> 3.4): tune 119 s, best
``dataloader.tuning:num_workers=2`` (its re-race: 2.32x, 99 % CI 1.71-4.07x, under load);
exhaustive 846 s (time ratio 0.14), best ``dataloader.tuning:num_workers=1+batch.size=8``.
In the head-to-head, run on a quieter machine (baseline IQR 3 %): tune's best 0.64x
(slower), the exhaustive best 0.83x (slower), the best single fix ``batch.size=32`` 1.24x
(faster). Both searches' winners were chosen under a load that favoured DataLoader workers
and did not hold once the machine was quieter: the targets (>= best single, within 5 % of
exhaustive) were not met on this machine; the time target was.
Third run, ``loader_batch``, ``--budget 120`` (gpudiag 68d82ee: a fix the best arm's own
diagnosis points to is combined with it even when it was slower alone), quiet machine (load
0.05 -> 3.2): tune 24 s, best ``batch.size=32``; its re-diagnosis named the DataLoader (75 %
of the step) and measured ``batch.size=32+dataloader.tuning=2`` (1.53x against the baseline,
undecided against ``batch.size=32`` after 11 rounds: dropped, with budget left); exhaustive
169 s (time ratio 0.14), best ``dataloader.tuning=2+batch.size=32``. Head to head: tune 1.75x,
best single 1.75x (the same arm), exhaustive 1.83x: tune at 0.957 of the exhaustive best. All
three targets met in this run; an undecided combination getting more rounds while budget is
left would close the rest of the gap.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import gpudiag as gd
from gpudiag import workloads
from gpudiag.fixes import Fix, check_conflicts
from gpudiag.step import Workload
from gpudiag.workloads.input_bound import AugmentedImages


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "n/a"
    return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


class ChainNet(nn.Module):
    """A conv stem, then a chain of small element-wise operations (unfused in eager)."""

    def __init__(self, links: int = 24) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, 10)
        self.links = links

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.adaptive_avg_pool2d(self.stem(x), 4).flatten(1).repeat(1, 16)
        for _ in range(self.links):
            h = torch.tanh(h * 1.01 + 0.01) * 0.5 + h * 0.5
        return self.head(h[:, :16])


def loader_batch() -> Workload:
    return workloads.get("input_bound", batch_size=4)


def loader_batch_chain() -> Workload:
    torch.manual_seed(0)
    loader = DataLoader(AugmentedImages(blur_passes=6), batch_size=4, shuffle=True)

    def loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    return Workload(
        ChainNet(),
        loss=loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        batch_size=4,
        dataloader=loader,
        name="loader_batch_chain",
    )


CASES = {"loader_batch": loader_batch, "loader_batch_chain": loader_batch_chain}


def subsets(fixes: list[Fix]) -> list[list[Fix]]:
    """Every non-empty subset with at most one value per fix that check_conflicts allows."""
    by_id: dict[str, list[Fix]] = {}
    for f in fixes:
        by_id.setdefault(f.spec.group or f.id, []).append(f)
    out = []
    for choice in itertools.product(*[[None, *v] for v in by_id.values()]):
        combo = [f for f in choice if f is not None]
        if not combo:
            continue
        try:
            check_conflicts(combo)
        except gd.FixConflictError:
            continue
        out.append(combo)
    return out


def _best(c: Any, *, single: bool) -> Any:
    arms = [
        a
        for a in c.arms
        if a.verdict == "faster" and a.applied and (len(a.fixes) == 1 or not single)
    ]
    return max(arms, key=lambda a: a.speedup.value) if arms else None


def run_case(name: str, budget: float, seed: int) -> dict[str, Any]:
    wl = CASES[name]()
    t0 = time.perf_counter()
    tuned = gd.tune(wl, time_budget_s=budget, progress=False, seed=seed)
    tune_s = time.perf_counter() - t0
    print(tuned)
    candidates = [c.fix for c in tuned.candidates]
    combos = subsets(candidates)
    t0 = time.perf_counter()
    exhaustive = gd.compare(
        CASES[name](), combos, progress=False, seed=seed, time_budget_s=10 * budget,
        max_rounds=40,
    )  # fmt: skip
    exhaustive_s = time.perf_counter() - t0
    print(exhaustive)
    ex_best, single = _best(exhaustive, single=False), _best(exhaustive, single=True)
    contenders: list[list[Fix]] = []
    for arm_fixes in (
        list(tuned.best.fixes),
        list(ex_best.fixes) if ex_best else [],
        list(single.fixes) if single else [],
    ):
        if arm_fixes and set(arm_fixes) not in [set(c) for c in contenders]:
            contenders.append(arm_fixes)
    final = gd.compare(CASES[name](), contenders, progress=False, seed=seed + 1, max_rounds=60)
    print(final)

    def speed(fixes: list[Fix] | tuple[Fix, ...]) -> float | None:
        if not fixes:
            return 1.0
        arm = final.arm(list(fixes))
        return arm.speedup.value if arm.speedup is not None else None

    return {
        "case": name,
        "candidates": len(candidates),
        "subsets": len(combos),
        "tune_best": tuned.best.label,
        "tune_speedup": speed(tuned.best.fixes),
        "single_best": single.label if single else "none faster",
        "single_speedup": speed(single.fixes) if single else 1.0,
        "exhaustive_best": ex_best.label if ex_best else "none faster",
        "exhaustive_speedup": speed(ex_best.fixes) if ex_best else 1.0,
        "tune_s": tune_s,
        "exhaustive_s": exhaustive_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"load average before: {_load()}")
    rows = [run_case(name, args.budget, args.seed) for name in args.cases.split(",")]
    print(f"load average after: {_load()}")
    header = (
        "case", "cands", "subsets", "tune best", "x", "best single", "x", "exhaustive best",
        "x", "tune/exh", "tune s", "exh s", "time ratio",
    )  # fmt: skip
    print(" | ".join(header))
    for r in rows:
        ratio = (
            r["tune_speedup"] / r["exhaustive_speedup"]
            if r["tune_speedup"] and r["exhaustive_speedup"]
            else float("nan")
        )
        cells = [
            r["case"], str(r["candidates"]), str(r["subsets"]),
            r["tune_best"], f"{r['tune_speedup'] or float('nan'):.2f}",
            r["single_best"], f"{r['single_speedup'] or float('nan'):.2f}",
            r["exhaustive_best"], f"{r['exhaustive_speedup'] or float('nan'):.2f}",
            f"{ratio:.3f}", f"{r['tune_s']:.0f}", f"{r['exhaustive_s']:.0f}",
            f"{r['tune_s'] / r['exhaustive_s']:.2f}",
        ]  # fmt: skip
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
