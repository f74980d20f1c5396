"""Byte sizes and durations, written and read one way (stdlib only, below every other layer).

``format_bytes`` writes a size in binary units (``1.50 GiB``, ``64 KiB``, ``512 B``), or with
``si=True`` in decimal ones (``2.0 MB``, as a trace's copy sizes are told). ``parse_bytes``
reads ``"4096"``, ``"64K"``, ``"1.5 GiB"``, ``"2GB"`` against a table of suffixes: each caller
names the table whose meaning its users expect (nccl-tests' ``1M`` = 2^20, a memory budget's
``2GB`` = 2 x 10^9) and keeps its own limits and error. ``format_seconds`` writes a duration
against a table of steps: each caller names the table its readers expect (a step time in
three significant digits, a comparison's cell, a wait in minutes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

_BINARY = (("GiB", GIB), ("MiB", MIB), ("KiB", KIB))
_SI = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def format_bytes(
    n: float | None,
    spec: str = ",.2f",
    *,
    si: bool = False,
    none: str = "N/A",
    unit: str | None = None,
) -> str:
    """``n`` bytes in the largest unit it reaches, its number written with ``spec``
    (``"g"``: ``1.5 GiB``); under a kilobyte a whole number of ``B``; ``none`` for None.
    ``unit`` (``"GiB"``, ``"MiB"``, ``"KiB"``): always that unit (``0.5 GiB``)."""
    if n is None:
        return none
    if unit is not None:
        return f"{n / dict(_BINARY)[unit]:{spec}} {unit}"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in _SI if si else _BINARY:
        if n >= scale:
            return f"{sign}{n / scale:{spec}} {unit}"
    return f"{sign}{int(n)} B"


# A duration's steps: (from this many seconds up, seconds per unit, unit, number format).
# The last step's floor is 0: it takes what is left.
Steps = Sequence[tuple[float, float, str, str]]

# A step time or spread: three significant digits, down to nanoseconds (``1.23 ms``).
SIGNIFICANT: Steps = (
    (1.0, 1.0, "s", ".3g"),
    (1e-3, 1e-3, "ms", ".3g"),
    (1e-6, 1e-6, "us", ".3g"),
    (0.0, 1e-9, "ns", ".3g"),
)
# A comparison's median step cell: ``1.25 s``, ``12.5 ms``, ``250 us``.
CELL: Steps = (
    (1.0, 1.0, "s", ".2f"),
    (1e-3, 1e-3, "ms", ".1f"),
    (0.0, 1e-6, "us", ".0f"),
)
# How long a wait is, as a person plans it: ``3 min``, ``45 s``, ``2.5 s``.
WAIT: Steps = (
    (120.0, 60.0, "min", ".0f"),
    (10.0, 1.0, "s", ".0f"),
    (0.0, 1.0, "s", ".1f"),
)


def format_seconds(seconds: float | None, steps: Steps = SIGNIFICANT, *, none: str = "n/a") -> str:
    """``seconds`` in the first of ``steps`` its size reaches (the sign kept); ``none`` for
    None, NaN and infinities."""
    if seconds is None or not math.isfinite(seconds):
        return none
    for floor, scale, unit, spec in steps:
        if abs(seconds) >= floor:
            return f"{seconds / scale:{spec}} {unit}"
    raise ValueError("a duration's last step must start at 0")


def _powers(letters: str, base: int) -> dict[str, int]:
    return {letter: base ** (i + 1) for i, letter in enumerate(letters)}


# Buffer sizes as nccl-tests takes them: every suffix binary (64K, 1M, 1MB, 1MiB are 2^n).
BINARY_SUFFIXES: Mapping[str, int] = {
    "": 1,
    "b": 1,
    **{f"{p}{s}": v for p, v in _powers("kmg", 1024).items() for s in ("", "b", "ib")},
}
# Memory sizes as vendors write them: KiB..EiB binary, KB..EB decimal, B or a bare number bytes.
SI_SUFFIXES: Mapping[str, int] = {
    "": 1,
    "b": 1,
    **{f"{p}ib": v for p, v in _powers("kmgtpe", 1024).items()},
    **{f"{p}b": v for p, v in _powers("kmgtpe", 1000).items()},
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str, suffixes: Mapping[str, int] = BINARY_SUFFIXES) -> float | None:
    """``"1.5MiB"`` -> 1572864.0: ASCII digits, an optional fraction and a suffix of
    ``suffixes`` (any case; ``""`` for a bare number where the table has it); None when the
    text is not such a size. The caller checks the range and says what it expects."""
    match = _SIZE.fullmatch(text)
    if match is None or match.group(2).lower() not in suffixes:
        return None
    return float(match.group(1)) * suffixes[match.group(2).lower()]


__all__ = [
    "BINARY_SUFFIXES",
    "CELL",
    "GIB",
    "KIB",
    "MIB",
    "SIGNIFICANT",
    "SI_SUFFIXES",
    "WAIT",
    "Steps",
    "format_bytes",
    "format_seconds",
    "parse_bytes",
]
