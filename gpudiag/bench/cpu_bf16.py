"""Is bf16 fast on this CPU? A short measured bf16-vs-fp32 matmul speed ratio, cached per process.

A CPU's flags (AVX512-BF16, AMX) say bf16 matmuls have hardware instructions, not that they
run faster than fp32 through torch's kernels: on some Xeons bf16 measured 0.6x fp32. Advice
that says "bf16 is faster" reads this measurement instead of the flags.
"""

from __future__ import annotations

import math
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
        return f"measured: {self.size}x{self.size}x{self.size} matmul, {ROUNDS} rounds{threads}"

    def __str__(self) -> str:
        if not self.measured:
            return f"bf16 matmul speed not measured: {self.reason}"
        how = self.source.removeprefix("measured: ")
        return (
            f"bf16 matmuls measured {self.ratio:.2f}x the speed of fp32 "
            f"({self.bf16_ms:.2f} ms vs {self.fp32_ms:.2f} ms, {how})"
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "ratio": self.ratio,
                "fp32_ms": self.fp32_ms,
                "bf16_ms": self.bf16_ms,
                "size": self.size,
                "threads": self.threads,
                "fast": self.fast,
                "reason": self.reason,
            }
        )


_MEASURED: Bf16Speed | None = None


def cpu_bf16_speed(*, refresh: bool = False) -> Bf16Speed:
    """The bf16/fp32 matmul speed ratio of this CPU, measured once per process (about 0.1 s; see
    benchmarks/cpu_bf16.py) and cached; ``refresh`` measures again."""
    global _MEASURED
    if _MEASURED is None or refresh:
        _MEASURED = measure_bf16_speed()
    return _MEASURED


def measure_bf16_speed(size: int = SIZE, rounds: int = ROUNDS) -> Bf16Speed:
    """Time fp32 and bf16 ``size``-square matmuls on the CPU on one thread, alternating
    ``rounds`` times with ``gpudiag.bench.timing.measure``; the ratio is of the fastest call of
    each. A bf16 product checked wrong (against float64) is no speed."""
    import torch

    from gpudiag.bench.gemm import TOLERANCE, check_product

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    a16, b16 = a.bfloat16(), b.bfloat16()
    threads = THREADS
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        try:
            error = check_product(a16, b16, a16 @ b16)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            return Bf16Speed(None, threads=threads, reason=f"bf16 matmul cannot run here: {exc}")
        if not error <= TOLERANCE["bf16"]:
            return Bf16Speed(
                None, threads=threads, reason=f"bf16 matmul gave a wrong result (error {error:.1e})"
            )
        a @ b  # warm both paths once
        fp32_s, bf16_s = [], []
        for _ in range(rounds):
            fp32_s.append(measure(lambda: a @ b, repeats=1, warmup=0, number=1).median_s)
            bf16_s.append(measure(lambda: a16 @ b16, repeats=1, warmup=0, number=1).median_s)
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
    )
