"""Stragglers of a multi-rank job: which rank is slow, by how much, and why when the evidence says.

Pure: per-rank step times and facts in, findings out. A rank is a straggler when its median
step time exceeds the median of the *other* ranks' medians by ``threshold`` (10 % by default):
leave-one-out, so with two ranks each is compared with the other and with many ranks one slow
rank cannot move its own reference. In a synchronous job (DDP, FSDP) every rank waits for the
slowest at each collective, so the job runs at the straggler's pace.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import jsonable

# A host whose 1-minute load average is above its usable CPUs is oversubscribed.
BUSY_LOAD_PER_CPU = 1.0
# Clock-event reasons (NVML) that mean the GPU was held below its clocks, not merely idle.
SLOWING_CLOCK_REASONS = frozenset(
    {
        "hw_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "sw_thermal_slowdown",
        "sw_power_cap",
        "sync_boost",
        "applications_clocks_setting",
    }
)


@dataclass(frozen=True)
class RankTiming:
    """One rank's measured step times and the facts that can explain a slow rank."""

    rank: int
    step_s: tuple[float, ...]
    host: str = ""
    gpu: str = ""  # GPU name, "" on a CPU rank
    clock_reasons: tuple[str, ...] = ()  # active NVML clock-event reasons of its GPU
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    load_average: float | None = None  # the host's 1-minute load average
    usable_cpus: int | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None


@dataclass(frozen=True)
class Straggler:
    rank: int
    median_s: float
    reference_s: float  # median of the other ranks' medians
    slower_by: float  # fraction: 0.25 is 25 % slower than the reference
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def wait_s_per_step(self) -> float:
        """What each other rank waits for it in every step of a synchronous job."""
        return self.median_s - self.reference_s

    def describe(self) -> str:
        why = "; ".join(self.reasons) if self.reasons else "no cause found in the evidence"
        return (
            f"rank {self.rank} is {self.slower_by:.0%} slower "
            f"({self.median_s * 1e3:.1f} ms vs {self.reference_s * 1e3:.1f} ms per step): {why}"
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "rank": self.rank,
                "median_s": self.median_s,
                "reference_s": self.reference_s,
                "slower_by": self.slower_by,
                "wait_s_per_step": self.wait_s_per_step,
                "reasons": list(self.reasons),
                "message": self.describe(),
            }
        )


def _reasons(slow: RankTiming, others: Sequence[RankTiming]) -> list[str]:
    reasons: list[str] = []
    slowing = [r for r in slow.clock_reasons if r in SLOWING_CLOCK_REASONS]
    if slowing:
        reasons.append(f"its GPU's clocks are held down ({', '.join(slowing)})")
    if slow.sm_clock_mhz and slow.max_sm_clock_mhz:
        share = slow.sm_clock_mhz / slow.max_sm_clock_mhz
        peers = [o.sm_clock_mhz for o in others if o.sm_clock_mhz]
        if peers and slow.sm_clock_mhz < 0.9 * statistics.median(peers):
            reasons.append(
                f"its SM clock is {slow.sm_clock_mhz} MHz ({share:.0%} of its maximum) while "
                f"the other ranks run at {statistics.median(peers):.0f} MHz"
            )
    if slow.gpu and any(o.gpu and o.gpu != slow.gpu for o in others):
        reasons.append(f"a different GPU ({slow.gpu}) from the other ranks'")
    if slow.load_average is not None and slow.usable_cpus:
        per_cpu = slow.load_average / slow.usable_cpus
        if per_cpu > BUSY_LOAD_PER_CPU:
            load = f"load average {slow.load_average:.1f} on {slow.usable_cpus} usable CPUs"
            neighbours = [o.rank for o in others if o.host == slow.host]
            if neighbours and slow.host:
                # The load is the host's: it does not say why this rank and not its neighbours.
                shared = ", ".join(str(r) for r in neighbours)
                reasons.append(
                    f"its host {slow.host} is oversubscribed ({load}), shared with rank(s) "
                    f"{shared}: the ranks compete for CPUs, so which one lags can change "
                    "from run to run"
                )
            else:
                reasons.append(f"its host {slow.host or '?'} is busy ({load})")
    peer_cpus = [o.usable_cpus for o in others if o.usable_cpus]
    if slow.usable_cpus and peer_cpus and slow.usable_cpus < statistics.median(peer_cpus):
        reasons.append(
            f"it may use {slow.usable_cpus} CPUs, the other ranks "
            f"{statistics.median(peer_cpus):.0f}"
        )
    hosts = {o.host for o in others if o.host}
    if slow.host and hosts and slow.host not in hosts:
        reasons.append(
            f"it is alone on host {slow.host}: its collectives cross the network between nodes"
        )
    return reasons


def find_stragglers(ranks: Sequence[RankTiming], *, threshold: float = 0.10) -> list[Straggler]:
    """Ranks whose median step is ``threshold`` or more slower than the others', slowest first."""
    timed = [r for r in ranks if r.step_s]
    found: list[Straggler] = []
    if len(timed) < 2:
        return found
    for r in timed:
        others = [o for o in timed if o.rank != r.rank]
        reference = statistics.median(o.median_s or 0.0 for o in others)
        median = r.median_s or 0.0
        if reference <= 0:
            continue
        slower = median / reference - 1.0
        if slower >= threshold:
            found.append(Straggler(r.rank, median, reference, slower, tuple(_reasons(r, others))))
    return sorted(found, key=lambda s: -s.slower_by)
