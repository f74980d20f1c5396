"""Findings as claims on the time ledger: a gain is a row's time x the share its fix removes.

Every trace rule that estimates a gain asks ``claim`` for it, so gains over the same window
add up, none exceeds the time its rows hold, and the ranking of findings follows the ledger:
the largest achievable gain comes first. The share a fix can remove is stated with its source
beside the row in the finding's evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.ledger import label_of
from gpudiag.rules.finding import Evidence

if TYPE_CHECKING:
    from gpudiag.analysis.trace.ledger import Ledger
    from gpudiag.analysis.trace.report import TraceReport


@dataclass(frozen=True)
class Claim:
    """The part of some ledger rows a finding is about, and what its fix can remove of it."""

    rows: tuple[str, ...]
    row_us: float  # time on those rows (every rank's, summed)
    claimed_us: float  # the part of it this finding is about (at most row_us)
    removable: float  # share of the claimed time the fix can remove
    source: str  # where that share comes from
    window_us: float
    scope: str = ""  # " (N ranks summed)" when pooled

    @property
    def gain(self) -> float:
        return self.claimed_us * self.removable / self.window_us if self.window_us > 0 else 0.0

    @property
    def row_share(self) -> float:
        return self.row_us / self.window_us if self.window_us > 0 else 0.0

    def evidence(self, src: str) -> tuple[Evidence, ...]:
        names = " + ".join(label_of(r) for r in self.rows)
        items = [
            Evidence(
                f"time-ledger row{'s' if len(self.rows) > 1 else ''}: {names}{self.scope}",
                round(self.row_us / 1e3, 3),
                f"ms, {self.row_share:.1%} of the window",
                src,
            )
        ]
        if self.claimed_us < self.row_us * 0.999:
            items.append(
                Evidence(
                    f"of it, the part this finding is about{self.scope}",
                    round(self.claimed_us / 1e3, 3),
                    "ms",
                    src,
                )
            )
        items.append(
            Evidence("share the fix can remove", round(100 * self.removable), "%", self.source)
        )
        return tuple(items)


def ledger_of(trace: TraceReport, rank: int | None = None) -> Ledger | None:
    """The trace's ledger (every rank pooled, or ``rank``'s), None when it has no GPU time to
    account for."""
    ledger = trace.ledger(rank)
    return ledger if ledger.window_us > 0 else None


def claim(
    trace: TraceReport,
    rows: tuple[str, ...],
    removable: float,
    source: str,
    claimed_us: float | None = None,
    rank: int | None = None,
) -> Claim | None:
    """A claim on ``rows`` of the trace's ledger (a row ending in "." takes every row it
    prefixes); ``claimed_us`` (default: all of it) is capped at their time. Every rank's
    ledger pooled, or ``rank``'s alone (a cost one rank shows for the whole job). None without
    a ledger."""
    ledger = ledger_of(trace, rank)
    if ledger is None:
        return None
    row_us = ledger.us(*rows)
    claimed = row_us if claimed_us is None else max(0.0, min(claimed_us, row_us))
    n = len(trace.ranks)
    scope = f" ({n} ranks summed)" if n > 1 else ""
    if rank is not None and n > 1:
        scope = f" (rank {rank})"
    return Claim(
        rows=tuple(r.rstrip(".") for r in rows),
        row_us=row_us,
        claimed_us=claimed,
        removable=removable,
        source=source,
        window_us=ledger.window_us,
        scope=scope,
    )
