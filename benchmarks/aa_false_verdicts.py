"""How often does gd.compare call a fix that does nothing "faster" or "slower"?

An A/A comparison: the baseline against ``control.none`` (gpudiag.fixes.control), a fix that
changes nothing and is proven applied. Every "faster" or "slower" is a false verdict; the
stated confidence (95 %) promises at most 5 % of them. Two parts:

* ``real``: ``gd.compare`` run for real on a small CPU workload, ``--runs`` times, on whatever
  noise this machine has (on a shared machine: a lot);
* ``simulated``: the same sequential verdict (gpudiag.analysis.verdict.judge, looks on the
  plan's schedule) on synthetic rounds with several noise shapes, many more times; beside it
  the protocol gpudiag used before (percentile bootstrap, looks at 99 % with two agreeing,
  a final 95 % interval from as few as 2 rounds), on the same rounds.

Run from the repository root:

    .venv/bin/python benchmarks/aa_false_verdicts.py --runs 30 --budget 5 --sim-runs 500

Each row gives the verdict counts, the false-verdict rate with its 95 % Wilson interval, and
whether the rate stays under the stated 5 %.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VERDICTS = ("faster", "slower", "no significant difference", "undecided")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def row(name: str, counts: Counter[str], extra: str = "") -> str:
    n = sum(counts.values())
    false = counts["faster"] + counts["slower"]
    low, high = wilson(false, n)
    cells = [f"{counts[v]:>6}" for v in VERDICTS]
    rate = f"{false / n:6.1%} [{low:5.1%}, {high:5.1%}]" if n else "n/a"
    ok = "yes" if n and false / n <= 0.05 else "NO"
    return f"{name:<38} {n:>5} {' '.join(cells)}  {rate}  {ok:>4}  {extra}"


def header() -> str:
    names = " ".join(f"{v[:6]:>6}" for v in VERDICTS)
    return (
        f"{'A/A comparison':<38} {'runs':>5} {names}  {'false verdicts [95% CI]':<24}  "
        f"{'<=5%':>4}  notes"
    )


# -- real comparisons --------------------------------------------------------------------


def real_aa(runs: int, budget_s: float, seed: int) -> tuple[Counter[str], str]:
    import torch

    import gpudiag as gd
    from gpudiag.fixes.control import NoChange
    from gpudiag.fixes.spec import registered
    from gpudiag.probe.system import inspect

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    workload = gd.Workload(
        model,
        batch=(x, y),
        loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        name="mlp 64-128-8",
    )
    system = inspect()
    counts: Counter[str] = Counter()
    rounds: list[int] = []
    t0 = time.perf_counter()
    with registered(NoChange):
        for i in range(runs):
            c = gd.compare(
                workload,
                ["control.none"],
                system=system,
                time_budget_s=budget_s,
                progress=False,
                measure_memory=False,
                drift_steps=0,
                warmup_steps=1,
                min_sample_s=0.01,
                seed=seed + i,
            )
            arm = c.arm("control.none")
            assert arm.verified, arm.proofs
            counts[str(arm.verdict)] += 1
            rounds.append(arm.step_time.n)
    took = time.perf_counter() - t0
    rounds.sort()
    note = (
        f"{took:.0f} s; rounds per run median {rounds[len(rounds) // 2]}, "
        f"max {rounds[-1]}; budget {budget_s:g} s"
    )
    return counts, note


# -- simulated rounds -------------------------------------------------------------------------

Noise = Callable[[random.Random], float]


def _student_t2(rng: random.Random) -> float:
    """Student's t with 2 degrees of freedom: heavy tails (infinite variance)."""
    return rng.gauss(0, 1) / math.sqrt((rng.gauss(0, 1) ** 2 + rng.gauss(0, 1) ** 2) / 2)


def _shapes() -> dict[str, Noise]:
    return {
        "lognormal 5 %": lambda r: r.lognormvariate(0, 0.05),
        "lognormal 30 %": lambda r: r.lognormvariate(0, 0.30),
        "heavy tail (t, 2 dof) 10 %": lambda r: math.exp(0.1 * _student_t2(r)),
        "rare 3x stalls (5 %)": lambda r: 3.0 if r.random() < 0.05 else r.lognormvariate(0, 0.02),
    }


def _rounds(noise: Noise, rng: random.Random, n: int) -> tuple[list[float], list[float]]:
    base, cand = [], []
    for _ in range(n):
        shared = rng.lognormvariate(0, 0.3)  # a busy machine slows both arms of a round
        base.append(shared * noise(rng))
        cand.append(shared * noise(rng))
    return base, cand


def sequential(base: Sequence[float], cand: Sequence[float], max_rounds: int) -> str:
    from gpudiag.analysis.verdict import VerdictPlan, judge

    plan = VerdictPlan(max_rounds=max_rounds)
    for n in range(1, max_rounds + 1):
        look = judge(base[:n], cand[:n], plan, final=n == max_rounds)
        if look.decided:
            return look.verdict
    return "undecided"


def before(base: Sequence[float], cand: Sequence[float], rounds: int) -> str:
    """The protocol gpudiag used before, given ``rounds`` rounds at most (a time budget): a
    percentile bootstrap, looks from round 5 at 99 % that stop after two agreeing ones (or
    one inside +/-5 %), then a final 95 % interval judged against 1 +- 1 % only, from as few
    as 2 rounds."""
    from gpudiag.analysis.stats import speedup_ci

    history: list[str] = []
    n = rounds
    for k in range(5, rounds + 1):
        est = speedup_ci(base[:k], cand[:k], confidence=0.99, resamples=1000)
        if est.low > 1.01:
            look = "faster"
        elif est.high < 1 / 1.01:
            look = "slower"
        elif est.low >= 1 / 1.05 and est.high <= 1.05:
            n = k
            break  # equivalent
        else:
            look = "undecided"
        history.append(look)
        if look in ("faster", "slower") and history[-2:] == [look, look]:
            n = k
            break
    if n < 2:
        return "undecided"  # "not judged"
    final = speedup_ci(base[:n], cand[:n], confidence=0.95)
    if final.low > 1.01:
        return "faster"
    if final.high < 1 / 1.01:
        return "slower"
    return "no significant difference"


def simulated(runs: int, max_rounds: int, seed: int) -> list[tuple[str, Counter[str], str]]:
    out = []
    for name, noise in _shapes().items():
        rng = random.Random(seed)
        now: Counter[str] = Counter()
        old: Counter[str] = Counter()
        old_short: Counter[str] = Counter()
        for _ in range(runs):
            base, cand = _rounds(noise, rng, max_rounds)
            now[sequential(base, cand, max_rounds)] += 1
            old[before(base, cand, max_rounds)] += 1
            old_short[before(base, cand, 2)] += 1
        out.append((f"{name}: now", now, f"up to {max_rounds} rounds"))
        out.append((f"{name}: before", old, f"up to {max_rounds} rounds"))
        out.append((f"{name}: before, budget", old_short, "time budget after 2 rounds"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="real A/A comparisons")
    parser.add_argument("--budget", type=float, default=5.0, help="time budget of each (s)")
    parser.add_argument("--sim-runs", type=int, default=500, help="simulated comparisons")
    parser.add_argument("--max-rounds", type=int, default=100, help="rounds at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-real", action="store_true", help="only the simulation")
    args = parser.parse_args(argv)

    print(header())
    if not args.no_real and args.runs > 0:
        counts, note = real_aa(args.runs, args.budget, args.seed)
        print(row("real gd.compare, CPU MLP: now", counts, note), flush=True)
    for name, counts, note in (
        simulated(max(0, args.sim_runs), args.max_rounds, args.seed) if (args.sim_runs > 0) else []
    ):
        print(row(name, counts, note), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
