"""Kernel launch statistics: short kernels, launch delay, and whether the GPU waits on the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.trace.breakdown import TimeBreakdown
from gpudiag.analysis.trace.kernels import SHORT_KERNEL_US
from gpudiag.analysis.trace.model import F64, I64, Events, Kind, fields_json

# The GPU is called launch-bound when short host waits (gaps under 100 us that end when the
# host launches the next kernel: launch overhead, not a long stall such as data loading)
# add up to at least 15 % of the span.
LAUNCH_GAP_US = 100.0
LAUNCH_BOUND_SHARE = 0.15


@dataclass(frozen=True)
class LaunchStats:
    """How kernels were launched (times in microseconds; None where the trace cannot tell)."""

    kernels: int
    short_kernels: int  # under 10 us
    short_kernel_time_share: float | None  # of all kernel time
    median_kernel_us: float | None
    launch_delay_median_us: float | None  # kernel start - its launch call's start
    launch_delay_p90_us: float | None
    launch_call_mean_us: float | None  # mean duration of cudaLaunchKernel-like calls
    host_wait_share: float | None  # GPU idle waiting for the host / span
    short_host_wait_share: float | None  # the part of it in gaps under 100 us
    median_host_wait_gap_us: float | None
    launch_bound: bool | None
    reason: str

    @property
    def short_kernel_share(self) -> float | None:
        return self.short_kernels / self.kernels if self.kernels else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["short_kernel_share"] = self.short_kernel_share
        return out


def launch_stats(
    events: Events,
    gpu_rows: I64,
    launch_rows: I64,
    breakdown: TimeBreakdown,
    host_wait_gaps: F64,
) -> LaunchStats:
    """``launch_rows[i]``: the runtime row that launched ``gpu_rows[i]`` (-1: not in trace).

    ``host_wait_gaps``: GPU-wide idle gaps classified as host wait (see ``breakdown``).
    """
    is_kernel = events.kind[gpu_rows] == Kind.KERNEL
    k_rows = gpu_rows[is_kernel]
    n = int(k_rows.size)
    if n == 0:
        return LaunchStats(0, 0, None, None, None, None, None, None, None, None, None, "no kernels")
    dur = events.dur[k_rows]
    short = dur < SHORT_KERNEL_US
    total = float(dur.sum())
    launches = launch_rows[is_kernel]
    linked = launches >= 0
    delay = events.ts[k_rows[linked]] - events.ts[launches[linked]]
    calls = np.unique(launches[linked])
    call_mean = float(events.dur[calls].mean()) if calls.size else None
    host_share = breakdown.share("idle_host_wait_us")
    median_gap = float(np.median(host_wait_gaps)) if host_wait_gaps.size else None
    span = breakdown.span_us
    short_share = (
        float(host_wait_gaps[host_wait_gaps < LAUNCH_GAP_US].sum()) / span if span > 0 else None
    )
    bound: bool | None
    if host_share is None or short_share is None:
        bound, reason = None, "no GPU span"
    elif not linked.any():
        bound, reason = None, "kernels are not linked to their launch calls in this trace"
    else:
        bound = short_share >= LAUNCH_BOUND_SHARE
        reason = (
            f"the GPU waits on the host {host_share:.0%} of the time, {short_share:.0%} in "
            f"gaps under {LAUNCH_GAP_US:.0f} us ({int(short.sum())} of {n} kernels run under "
            f"{SHORT_KERNEL_US:.0f} us)"
        )
    return LaunchStats(
        kernels=n,
        short_kernels=int(short.sum()),
        short_kernel_time_share=float(dur[short].sum() / total) if total > 0 else None,
        median_kernel_us=float(np.median(dur)),
        launch_delay_median_us=float(np.median(delay)) if delay.size else None,
        launch_delay_p90_us=float(np.percentile(delay, 90)) if delay.size else None,
        launch_call_mean_us=call_mean,
        host_wait_share=host_share,
        short_host_wait_share=short_share,
        median_host_wait_gap_us=median_gap,
        launch_bound=bound,
        reason=reason,
    )
