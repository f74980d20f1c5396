"""Is bf16 fast on this CPU? A short measured bf16-vs-fp32 matmul speed ratio, cached per process.

A CPU's flags (AVX512-BF16, AMX) say bf16 matmuls have hardware instructions, not that they
run faster than fp32 through torch's kernels: on some Xeons bf16 measured 0.6x fp32. Advice
that says "bf16 is faster" reads this measurement instead of the flags.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpudiag._report import jsonable
from gpudiag.bench.timing import measure

SIZE = 512  # square matmul: compute-bound, about 3 ms in fp32 on one core
# One intra-op thread: a per-core ratio, and no oversubscription on a shared machine (two
# threads on a busy 2-core host made each call 4x slower and the ratio noisy).
THREADS = 1
ROUNDS = 15  # fp32 and bf16 alternate, one call each, so a busy host slows both alike
# bf16 is called fast from this measured speed-up on (below it, keep fp32: the casts and a
# slower backward can eat a smaller gain).
FAST_RATIO = 1.25


@dataclass(frozen=True, slots=True)
class Bf16Speed:
    """bf16 vs fp32 matmul speed on this CPU: ``ratio`` = fp32 time / bf16 time (>1: bf16 is
    faster), or None with ``reason`` when bf16 matmuls could not run or gave wrong results."""

    ratio: float | None
    fp32_ms: float | None = None
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

    @property
    def measured(self) -> bool:
        return self.ratio is not None and math.isfinite(self.ratio)

    @property
    def fast(self) -> bool:
        """bf16 was measured at least ``FAST_RATIO`` times as fast as fp32."""
        return self.measured and (self.ratio or 0.0) >= FAST_RATIO

    @property
    def source(self) -> str:
        threads = (
            f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        )
        if self.shapes:
            products = ", ".join(f"{m}x{k} @ {k}x{n}" for m, n, k in self.shapes)
            share = f", {self.covered:.0%} of its fp32 matmul time" if self.covered else ""
            return (
                f"measured: the step's own matmuls ({products}{share}), bf16 with autocast's "
                f"input cast, weighted by their time, {ROUNDS} rounds{threads}"
            )
        if self.shape is not None:
            m, n, k = self.shape
            what = f"the step's own {m}x{k} @ {k}x{n} matmul, bf16 with autocast's input cast"
        else:
            what = f"{self.size}x{self.size}x{self.size} matmul"
        return f"measured: {what}, {ROUNDS} rounds{threads}"

    def __str__(self) -> str:
        if not self.measured:
            return f"bf16 matmul speed not measured: {self.reason}"
        how = self.source.removeprefix("measured: ")
        if self.bf16_ms is not None and self.fp32_ms is not None:
            how = f"{self.bf16_ms:.2f} ms vs {self.fp32_ms:.2f} ms, {how}"
        return f"bf16 matmuls measured {self.ratio:.2f}x the speed of fp32 ({how})"

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "ratio": self.ratio,
                "fp32_ms": self.fp32_ms,
                "bf16_ms": self.bf16_ms,
                "size": self.size,
                "threads": self.threads,
                "shape": self.shape,
                "shapes": self.shapes,
                "covered": self.covered,
                "fast": self.fast,
                "reason": self.reason,
            }
        )


_MEASURED: Bf16Speed | None = None  # the SIZE-cubed product's, once per process
_BY_SHAPE: dict[tuple[int, int, int], Bf16Speed] = {}
# A workload's matmul is timed in batches of calls that add up to about the work of one
# SIZE-cubed product, so a small one is not lost in the timer's resolution.
MAX_CALLS = 4096


def cpu_bf16_speed(
    shape: tuple[int, int, int] | None = None, *, refresh: bool = False
) -> Bf16Speed:
    """The bf16/fp32 matmul speed ratio of this CPU, measured once per process and shape
    (about 0.1 s; see benchmarks/cpu_bf16.py) and cached; ``refresh`` measures again.

    ``shape``: (M, N, K) of the workload's own matmul. Small products gain far less from bf16
    than a large square one (the casts and the kernels' fixed costs stay), so advice about a
    workload times its own shape; without one, a SIZE-cubed square product.
    """
    global _MEASURED
    if shape is not None:
        if shape not in _BY_SHAPE or refresh:
            _BY_SHAPE[shape] = measure_bf16_speed(shape=shape)
        return _BY_SHAPE[shape]
    if _MEASURED is None or refresh:
        _MEASURED = measure_bf16_speed()
    return _MEASURED


def workload_bf16_speed(
    matmuls: Sequence[tuple[tuple[int, int, int], float]], *, covered: float | None = None
) -> Bf16Speed:
    """bf16/fp32 speed of a workload's own matmuls: each (M, N, K) product measured (cached),
    the ratios weighted by each product's fp32 time (``matmuls``: shape and its time), so the
    ratio is the workload's matmul time in fp32 over the same in bf16. ``covered``: the share
    of the workload's fp32 matmul time these products are."""
    shapes = tuple(shape for shape, _ in matmuls)
    speeds = [(cpu_bf16_speed(shape), weight) for shape, weight in matmuls if weight > 0]
    if not speeds:
        return Bf16Speed(None, shapes=shapes, covered=covered, reason="no timed matmul")
    failed = next((speed for speed, _ in speeds if not speed.measured), None)
    if failed is not None:
        return dataclasses.replace(failed, shape=None, shapes=shapes, covered=covered)
    fp32_time = sum(weight for _, weight in speeds)
    bf16_time = sum(weight / (speed.ratio or math.inf) for speed, weight in speeds)
    return Bf16Speed(
        fp32_time / bf16_time if bf16_time > 0 else math.nan,
        threads=speeds[0][0].threads,
        shapes=shapes,
        covered=covered,
    )


def measure_bf16_speed(
    size: int = SIZE, rounds: int = ROUNDS, *, shape: tuple[int, int, int] | None = None
) -> Bf16Speed:
    """Time fp32 and bf16 matmuls on the CPU on one thread, alternating ``rounds`` times with
    ``gpudiag.bench.timing.measure``; the ratio is of the fastest sample of each. The product
    is ``size``-square, or M x K @ K x N for ``shape`` = (M, N, K). A bf16 product checked
    wrong (against float64) is no speed."""
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
            fp32_s.append(measure(lambda: a @ b, repeats=1, warmup=0, number=calls).median_s)
            bf16_s.append(measure(bf16_call, repeats=1, warmup=0, number=calls).median_s)
    finally:
        torch.set_num_threads(before)
    # The fastest call of each: what the hardware does when no other process interrupts it
    # (a shared host only ever adds time to a call).
    fastest_32, fastest_16 = min(fp32_s), min(bf16_s)
    return Bf16Speed(
        fastest_32 / fastest_16 if fastest_16 > 0 else math.nan,
        fp32_ms=fastest_32 * 1e3,
        bf16_ms=fastest_16 * 1e3,
        size=size,
        threads=threads,
        shape=shape,
    )
