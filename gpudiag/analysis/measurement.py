"""A measurement that describes its own noise: raw samples, median, IQR, a label, warnings.

Pure Python (no numpy) so that light modules such as ``gpudiag.bench`` can use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Facts
from gpudiag.units import format_seconds

# torch.utils.benchmark's Measurement warns when the IQR exceeds 10 % of the median
# (torch/utils/benchmark/utils/common.py); we use the same line.
SPREAD_WARNING = 0.10


def quantile(samples: Sequence[float], fraction: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def quartiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) of ``samples``; NaN for no samples."""
    return quantile(samples, 0.25), quantile(samples, 0.5), quantile(samples, 0.75)


@dataclass(frozen=True)
class Measurement(Carded):
    """Raw per-step times of one arm, with the robust summaries a comparison needs.

    ``samples_s`` are seconds per step (each sample may average several consecutive steps).
    The median and IQR, not the mean, describe it: a shared machine adds long outliers.
    """

    samples_s: tuple[float, ...]
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples_s", tuple(float(s) for s in self.samples_s))

    @property
    def n(self) -> int:
        return len(self.samples_s)

    def _q(self, q: float) -> float:
        return quantile(self.samples_s, q)

    @property
    def median_s(self) -> float:
        return self._q(0.5)

    @property
    def q1_s(self) -> float:
        return self._q(0.25)

    @property
    def q3_s(self) -> float:
        return self._q(0.75)

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.samples_s) if self.samples_s else math.nan

    @property
    def min_s(self) -> float:
        return min(self.samples_s) if self.samples_s else math.nan

    @property
    def relative_spread(self) -> float:
        """IQR / median: 0.05 means the middle half of the samples lies within 5 % of the median."""
        median = self.median_s
        return self.iqr_s / median if median > 0 else math.nan

    @property
    def has_large_spread(self) -> bool:
        return self.n >= 4 and self.relative_spread > SPREAD_WARNING

    def warnings(self) -> tuple[str, ...]:
        out = []
        if self.n < 4:
            out.append(f"only {self.n} sample(s): the spread cannot be judged")
        elif self.has_large_spread:
            out.append(
                f"the IQR is {self.relative_spread:.0%} of the median: the timings are noisy "
                "(other processes, frequency scaling); take more samples or use a quieter machine"
            )
        return tuple(out)

    def summary(self) -> str:
        return (
            f"median {format_seconds(self.median_s)}, IQR {format_seconds(self.iqr_s)} "
            f"({self.relative_spread:.0%}), {self.n} samples"
        )

    def __repr__(self) -> str:
        name = f"{self.label!r}" if self.label else ""
        text = f"Measurement({name}): {self.summary()}"
        for w in self.warnings():
            text += f"\n  WARNING: {w}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "label": self.label,
                "n": self.n,
                "median_s": self.median_s,
                "q1_s": self.q1_s,
                "q3_s": self.q3_s,
                "iqr_s": self.iqr_s,
                "mean_s": self.mean_s,
                "relative_spread": self.relative_spread,
                "warnings": list(self.warnings()),
                "samples_s": list(self.samples_s),
            }
        )

    def as_card(self) -> Card:
        rows: list[tuple[object, object]] = [
            ("median", format_seconds(self.median_s)),
            ("IQR", f"{format_seconds(self.iqr_s)} ({self.relative_spread:.0%} of the median)"),
            ("samples", self.n),
        ]
        rows += [("warning", w) for w in self.warnings()]
        return Card(f"Measurement {self.label}".strip(), [Facts(rows)])


# The slowest repetition this many times the fastest is a swing worth a word even when the
# middle half of the samples is tight (a busy host stalls a few repetitions for a long time).
SWING_WARNING = 2.0


def noise_warning(cases: Sequence[tuple[str, Measurement | None]]) -> str | None:
    """One warning for a set of measurements (a benchmark's cases), or None when they are calm.

    A case is noisy when its ``Measurement.warnings()`` say so (IQR over 10 % of the median,
    the line gd.compare uses) or its slowest repetition is ``SWING_WARNING`` times its fastest.
    """
    noisy: list[tuple[str, float, float]] = []
    for name, m in cases:
        if m is None or m.n < 4:
            continue
        fastest = m.min_s
        swing = max(m.samples_s) / fastest if fastest > 0 else math.inf
        if m.has_large_spread or swing >= SWING_WARNING:
            noisy.append((name, m.relative_spread, swing))
    if not noisy:
        return None
    worst_spread = max(spread for _, spread, _ in noisy)
    worst_swing = max(noisy, key=lambda item: item[2])
    return (
        f"WARNING: the timings swung in {len(noisy)} of {len(cases)} cases (IQR up to "
        f"{worst_spread:.0%} of the median; slowest repetition {worst_swing[2]:.1f}x the "
        f"fastest in {worst_swing[0]}): other processes or frequency scaling; these numbers "
        "are not reliable, rerun on a quieter machine"
    )
