"""Timing done right: synchronised clocks, warm-up outside the numbers, median and IQR."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpudiag.analysis.measurement import SPREAD_WARNING as SPREAD_WARNING
from gpudiag.analysis.measurement import Measurement as BaseMeasurement
from gpudiag.analysis.measurement import quartiles as quartiles
from gpudiag.errors import ArgumentError
from gpudiag.units import format_seconds

Clock = Callable[[], float]
# A timer is a context-manager factory: on exit it appends the elapsed seconds to the list it
# yielded. ``gpudiag.probe.cuda.device_timer`` (CUDA events) has this shape, so does host_timer.
Timer = Callable[[], AbstractContextManager[list[float]]]

T = TypeVar("T")


def host_timer(clock: Clock = time.perf_counter, sync: Callable[[], None] | None = None) -> Timer:
    """A timer reading ``clock``, calling ``sync`` before each reading.

    The sync matters on asynchronous devices: without it a host clock measures kernel launches,
    not the kernels.
    """

    @contextmanager
    def timer() -> Iterator[list[float]]:
        out: list[float] = []
        if sync is not None:
            sync()
        start = clock()
        yield out
        if sync is not None:
            sync()
        out.append(clock() - start)

    return timer


@dataclass(frozen=True)
class Measurement(BaseMeasurement):
    """Repeated timings of one operation, in seconds per call.

    ``samples_s`` holds one value per repetition; each repetition timed ``number`` calls back to
    back and divided. ``warmup_calls`` calls ran first and are not in the samples. The summaries
    (median_s, iqr_s, relative_spread, warnings) are those of every gpudiag measurement.
    """

    number: int = 1
    warmup_calls: int = 0

    def rate(self, amount: float) -> float:
        """``amount`` per second at the median time (e.g. FLOPs -> FLOP/s)."""
        median = self.median_s
        return amount / median if median > 0 else math.inf

    def rate_spread(self, amount: float) -> tuple[float, float]:
        """The rate at the Q3 and Q1 times: the interquartile range of the rate, low to high."""
        q1, _, q3 = quartiles(self.samples_s)
        return (amount / q3 if q3 > 0 else math.inf, amount / q1 if q1 > 0 else math.inf)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(number=self.number, warmup_calls=self.warmup_calls)
        return out

    def __repr__(self) -> str:
        text = (
            f"Measurement({self.label + ': ' if self.label else ''}"
            f"median {format_seconds(self.median_s)}, "
            f"IQR {format_seconds(self.iqr_s)} ({self.relative_spread:.0%}), {self.n} samples of "
            f"{self.number} call{'s' if self.number != 1 else ''})"
        )
        for warning in self.warnings():
            text += f"\n  WARNING: {warning}"
        return text


def measure(
    fn: Callable[[], object],
    *,
    repeats: int = 10,
    warmup: int = 1,
    number: int | None = None,
    min_sample_s: float = 1e-3,
    max_time_s: float | None = None,
    min_repeats: int = 3,
    timer: Timer | None = None,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] | None = None,
    label: str = "",
) -> Measurement:
    """Time ``fn`` and keep every sample.

    ``warmup`` calls run first, untimed. When ``number`` is None one more (untimed for the
    samples) call is timed to pick how many calls each repetition needs so that it lasts at least
    ``min_sample_s`` (short calls are otherwise dominated by clock and launch overhead). Then
    ``repeats`` repetitions are timed, each ``number`` calls long; after ``min_repeats`` of them
    the loop stops early once ``max_time_s`` has passed on ``clock``.

    ``timer`` defaults to ``host_timer(clock, sync)``; pass ``gpudiag.probe.cuda.device_timer`` to
    time with device events.
    """
    if repeats < 1 or warmup < 0 or (number is not None and number < 1):
        raise ArgumentError("repeats and number must be >= 1 and warmup >= 0")
    timed = timer if timer is not None else host_timer(clock, sync)
    started = clock()
    for _ in range(warmup):
        fn()
    calls_before = warmup
    if number is None:
        with timed() as elapsed:
            fn()
        calls_before += 1
        one_call_s = elapsed[0]
        number = (
            1 if one_call_s >= min_sample_s else math.ceil(min_sample_s / max(one_call_s, 1e-9))
        )
        number = min(number, 100_000)
    samples: list[float] = []
    for _ in range(repeats):
        with timed() as elapsed:
            for _ in range(number):
                fn()
        samples.append(elapsed[0] / number)
        if (
            max_time_s is not None
            and len(samples) >= min_repeats
            and clock() - started >= max_time_s
        ):
            break
    return Measurement(tuple(samples), label, number, calls_before)


class Rotation(Generic[T]):
    """Cycles through several copies of the inputs so that no call finds them in cache.

    A benchmark that reuses one small input measures the cache, not the memory; rotating copies
    whose total is a few times the last-level cache makes every call fetch its data again.
    """

    def __init__(self, items: Sequence[T]) -> None:
        if not items:
            raise ArgumentError("a rotation needs at least one item")
        self.items = tuple(items)
        self._next = 0

    def __len__(self) -> int:
        return len(self.items)

    def next(self) -> T:
        item = self.items[self._next]
        self._next = (self._next + 1) % len(self.items)
        return item


def copies_to_exceed_cache(
    bytes_per_copy: int,
    cache_bytes: int,
    *,
    factor: float = 2.0,
    max_total_bytes: int | None = None,
) -> int:
    """How many copies of an input make a working set ``factor`` times the last-level cache.

    Capped so the copies together stay under ``max_total_bytes`` (at least one copy).
    """
    if bytes_per_copy <= 0:
        return 1
    copies = max(1, math.ceil(factor * cache_bytes / bytes_per_copy))
    if max_total_bytes is not None:
        copies = min(copies, max(1, max_total_bytes // bytes_per_copy))
    return copies
