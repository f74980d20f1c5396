"""Is bf16 fast on this CPU? A measured bf16-vs-fp32 matmul speed with its interval, once a process.

A CPU's flags (AVX512-BF16, AMX) say bf16 matmuls have hardware instructions, not that they
run faster than fp32 through torch's kernels: on some Xeons bf16 measured 0.6x fp32. Advice
that says "bf16 is faster" reads this measurement instead of the flags.

The answer is three-way: ``faster`` or ``slower`` only when the whole confidence interval of
the speed ratio clears 1 by ``MARGIN``, ``undecided`` otherwise, so a noisy host gives no
answer rather than a flipped one. The process's answer for the square product is kept in
``gpudiag._measured`` (``fact("cpu_bf16_speed")``), where ``gd.inspect`` reads it too; so is
the latest workload's own matmuls' answer (``fact("workload_bf16_speed")``, what
``gd.diagnose``'s precision advice measured), which inspect shows beside it, each saying which
product it timed: a workload's small products gain less from bf16 than the square one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpudiag import _measured
from gpudiag._report import card, html_table, jsonable
from gpudiag.bench.timing import measure

SIZE = 512  # square matmul: compute-bound, about 3 ms in fp32 on one core
# One intra-op thread: a per-core ratio, and no oversubscription on a shared machine (two
# threads on a busy 2-core host made each call 4x slower and the ratio noisy).
THREADS = 1
ROUNDS = 15  # fp32 and bf16 alternate, so a busy host slows both alike
# Each round keeps the best of this many timings of each: a call the scheduler interrupted
# only ever takes longer. Measured at load 8.7 on 2 cores, the 512-cubed ratio from one
# timing per round was 3.2x (95% CI 1.2-12.9x), from the best of 3: 4.2x (4.1-4.4x).
REPEATS = 3
# bf16 is worth switching to from this measured speed-up on (below it, keep fp32: the casts
# and a slower backward can eat a smaller gain). The precision rule reads it.
FAST_RATIO = 1.25
CONFIDENCE = 0.99
# A ratio whose interval reaches within this share of 1 is no answer either way.
MARGIN = 0.05
FACT = "cpu_bf16_speed"  # the square product's answer in gpudiag._measured
# The latest workload's own matmuls (workload_bf16_speed, what gd.diagnose's advice read), kept
# beside it so gd.inspect shows that answer too, saying which product each one timed.
WORKLOAD_FACT = "workload_bf16_speed"

Answer = Literal["faster", "slower", "undecided", "not measured"]


@dataclass(frozen=True, slots=True, repr=False)
class Bf16Speed:
    """bf16 vs fp32 matmul speed on this CPU: ``ratio`` = fp32 time / bf16 time (>1: bf16 is
    faster; the median of the per-round ratios), ``low``-``high`` its ``confidence`` interval,
    ``answer`` what that interval says; or ``ratio`` None with ``reason`` when bf16 matmuls
    could not run or gave wrong results."""

    ratio: float | None
    fp32_ms: float | None = None  # one call, median over the rounds
    bf16_ms: float | None = None
    size: int = SIZE
    threads: int | None = None
    reason: str = ""
    # (M, N, K) of the product timed when it was the workload's own matmul, else None (the
    # SIZE-cubed square product).
    shape: tuple[int, int, int] | None = None
    # A workload's ratio (workload_bf16_speed): the products timed, and their share of the
    # step's fp32 matmul time.
    shapes: tuple[tuple[int, int, int], ...] = ()
    covered: float | None = None
    # The interval of ``ratio`` (paired bootstrap over the rounds) and each round's ratio.
    low: float | None = None
    high: float | None = None
    rounds: tuple[float, ...] = ()
    confidence: float = CONFIDENCE

    @property
    def measured(self) -> bool:
        return self.ratio is not None and math.isfinite(self.ratio)

    @property
    def answer(self) -> Answer:
        """``faster`` / ``slower`` when the whole interval clears 1 by ``MARGIN``; otherwise
        ``undecided`` (a ratio without an interval decides nothing)."""
        if not self.measured:
            return "not measured"
        if self.low is None or self.high is None:
            return "undecided"
        if self.low >= 1.0 + MARGIN:
            return "faster"
        if self.high <= 1.0 / (1.0 + MARGIN):
            return "slower"
        return "undecided"

    @property
    def interval(self) -> str:
        """``95% CI 1.46-1.50x``, or what is missing."""
        if self.low is None or self.high is None:
            return "no interval"
        return f"{self.confidence:.0%} CI {self.low:.2f}-{self.high:.2f}x"

    @property
    def source(self) -> str:
        threads = (
            f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        )
        rounds = len(self.rounds) or ROUNDS
        if self.shapes:
            products = ", ".join(f"{m}x{k} @ {k}x{n}" for m, n, k in self.shapes)
            share = f", {self.covered:.0%} of its fp32 matmul FLOPs" if self.covered else ""
            return (
                f"measured: the step's own matmuls ({products}{share}), bf16 with autocast's "
                f"input cast, weighted by their fp32 time in a step, {rounds} rounds{threads}"
            )
        if self.shape is not None:
            m, n, k = self.shape
            what = f"the step's own {m}x{k} @ {k}x{n} matmul, bf16 with autocast's input cast"
        else:
            what = f"{self.size}x{self.size}x{self.size} matmul"
        return f"measured: {what}, {rounds} rounds{threads}"

    def __str__(self) -> str:
        if not self.measured:
            return f"bf16 matmul speed not measured: {self.reason}"
        how = self.source.removeprefix("measured: ")
        if self.bf16_ms is not None and self.fp32_ms is not None:
            how = f"median {self.bf16_ms:.2f} ms vs {self.fp32_ms:.2f} ms, {how}"
        return (
            f"bf16 matmuls measured {self.ratio:.2f}x the speed of fp32 ({self.interval}): "
            f"{self.answer} ({how})"
        )

    # A notebook or terminal shows the sentence, not fifteen raw floats (``to_dict`` has them).
    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        title = "bf16 vs fp32 matmul speed on this CPU"
        if not self.measured:
            return card(title, html_table([("answer", "not measured"), ("why", self.reason)]))
        rows: list[tuple[object, object]] = [
            ("answer", f"bf16 is {self.answer}" if self.answer != "undecided" else "undecided"),
            ("speed", f"{self.ratio:.2f}x fp32 ({self.interval})"),
        ]
        if self.bf16_ms is not None and self.fp32_ms is not None:
            rows.append(("one call", f"bf16 {self.bf16_ms:.2f} ms, fp32 {self.fp32_ms:.2f} ms"))
        rows.append(("how", self.source.removeprefix("measured: ")))
        return card(title, html_table(rows))

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "ratio": self.ratio,
                "low": self.low,
                "high": self.high,
                "confidence": self.confidence,
                "answer": self.answer,
                "rounds": self.rounds,
                "fp32_ms": self.fp32_ms,
                "bf16_ms": self.bf16_ms,
                "size": self.size,
                "threads": self.threads,
                "shape": self.shape,
                "shapes": self.shapes,
                "covered": self.covered,
                "reason": self.reason,
            }
        )


_BY_SHAPE: dict[tuple[int, int, int], Bf16Speed] = {}
# A workload's matmul is timed in batches of calls that add up to about the work of one
# SIZE-cubed product, so a small one is not lost in the timer's resolution.
MAX_CALLS = 512


def cpu_bf16_speed(
    shape: tuple[int, int, int] | None = None, *, refresh: bool = False
) -> Bf16Speed:
    """The bf16/fp32 matmul speed of this CPU with its interval and answer, measured once per
    process and shape (about 0.1 s; see benchmarks/cpu_bf16.py) and cached; ``refresh``
    measures again.

    ``shape``: (M, N, K) of the workload's own matmul. Small products gain far less from bf16
    than a large square one (the casts and the kernels' fixed costs stay), so advice about a
    workload times its own shape; without one, a SIZE-cubed square product, kept as the
    process's machine fact (``gpudiag._measured.fact("cpu_bf16_speed")``).
    """
    if shape is not None:
        if shape not in _BY_SHAPE or refresh:
            _BY_SHAPE[shape] = measure_bf16_speed(shape=shape)
        return _BY_SHAPE[shape]
    known = _measured.fact(FACT)
    if not isinstance(known, Bf16Speed) or refresh:
        known = measure_bf16_speed()
        _measured.record_fact(FACT, known)
    return known


def _interval(
    fp32_s: Sequence[float], bf16_s: Sequence[float]
) -> tuple[float, float, float, tuple[float, ...]]:
    """Median per-round ratio, its interval (paired bootstrap, seeded) and the rounds' ratios."""
    from gpudiag.analysis.stats import speedup_ci  # numpy: not at `import gpudiag.bench`

    estimate = speedup_ci(fp32_s, bf16_s, confidence=CONFIDENCE, paired=True)
    rounds = tuple(a / b if b > 0 else math.nan for a, b in zip(fp32_s, bf16_s, strict=True))
    return estimate.value, estimate.low, estimate.high, rounds


def workload_bf16_speed(
    matmuls: Sequence[tuple[tuple[int, int, int], float]], *, covered: float | None = None
) -> Bf16Speed:
    """bf16/fp32 speed of a workload's own matmuls: each (M, N, K) product measured (cached),
    combined round by round, each weighted by its fp32 time in the step (``matmuls``: shape
    and how many such products a step makes; the time of one is the measurement's own fp32
    time, so the weights do not move with a profiled run's noise). A round's ratio is the
    workload's matmul time in fp32 over the same in bf16; the interval comes from those
    rounds. ``covered``: the share of the workload's fp32 matmul FLOPs these products are."""
    shapes = tuple(shape for shape, _ in matmuls)
    measured = [(cpu_bf16_speed(shape), calls) for shape, calls in matmuls if calls > 0]
    if not measured:
        return Bf16Speed(None, shapes=shapes, covered=covered, reason="no timed matmul")
    failed = next((speed for speed, _ in measured if not speed.measured), None)
    if failed is not None:
        return dataclasses.replace(failed, shape=None, shapes=shapes, covered=covered)
    speeds = [(speed, calls * (speed.fp32_ms or 1.0)) for speed, calls in measured]
    fp32_time = sum(weight for _, weight in speeds)
    bf16_time = sum(weight / (speed.ratio or math.inf) for speed, weight in speeds)
    combined = Bf16Speed(
        fp32_time / bf16_time if bf16_time > 0 else math.nan,
        threads=speeds[0][0].threads,
        shapes=shapes,
        covered=covered,
    )
    n = min(len(speed.rounds) for speed, _ in speeds)
    if n < 2:  # a product measured without its rounds: a ratio, no interval
        _measured.record_fact(WORKLOAD_FACT, combined)
        return combined
    bf16_rounds = [sum(w / s.rounds[i] for s, w in speeds) for i in range(n)]
    ratio, low, high, rounds = _interval([fp32_time] * n, bf16_rounds)
    combined = dataclasses.replace(combined, ratio=ratio, low=low, high=high, rounds=rounds)
    _measured.record_fact(WORKLOAD_FACT, combined)
    return combined


def measure_bf16_speed(
    size: int = SIZE, rounds: int = ROUNDS, *, shape: tuple[int, int, int] | None = None
) -> Bf16Speed:
    """Time fp32 and bf16 matmuls on the CPU on one thread, alternating ``rounds`` times with
    ``gpudiag.bench.timing.measure`` (the best of ``REPEATS`` timings of each per round); the
    ratio is the median of the rounds' ratios, with a paired bootstrap interval. The product
    is ``size``-square, or M x K @ K x N for ``shape`` = (M, N, K). A bf16 product checked
    wrong (against float64) is no speed."""
    import statistics

    import torch

    from gpudiag.bench.gemm import TOLERANCE, check_product

    m, n, k = shape if shape is not None else (size, size, size)
    if min(m, n, k) < 1:
        return Bf16Speed(None, shape=shape, reason=f"not a matrix product: {m}x{k} @ {k}x{n}")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    calls = max(1, min(MAX_CALLS, size**3 // (m * n * k)))
    a16, b16 = a.bfloat16(), b.bfloat16()
    threads = THREADS
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        try:
            error = check_product(a16, b16, a16 @ b16)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            reason = f"bf16 matmul cannot run here: {exc}"
            return Bf16Speed(None, threads=threads, reason=reason, shape=shape)
        if not error <= TOLERANCE["bf16"]:
            reason = f"bf16 matmul gave a wrong result (error {error:.1e})"
            return Bf16Speed(None, threads=threads, reason=reason, shape=shape)
        # For a workload's own product, autocast's cast of the activations is part of the bf16
        # call (its weights' casts are cached across the step).
        bf16_call = (lambda: a.bfloat16() @ b16) if shape is not None else (lambda: a16 @ b16)
        a @ b  # warm both paths once
        bf16_call()
        fp32_s, bf16_s = [], []
        for _ in range(rounds):
            fp32_s.append(measure(lambda: a @ b, repeats=REPEATS, warmup=0, number=calls).min_s)
            bf16_s.append(measure(bf16_call, repeats=REPEATS, warmup=0, number=calls).min_s)
    finally:
        torch.set_num_threads(before)
    # Each round's two calls ran back to back, so a busy moment of the host slows both: the
    # per-round ratio cancels it, and the spread of those ratios is the interval.
    ratio, low, high, per_round = _interval(fp32_s, bf16_s)
    return Bf16Speed(
        ratio,
        fp32_ms=statistics.median(fp32_s) * 1e3,
        bf16_ms=statistics.median(bf16_s) * 1e3,
        size=size,
        threads=threads,
        shape=shape,
        low=low,
        high=high,
        rounds=per_round,
    )
