"""Derived monitor metrics: peak memory bandwidth, bandwidth estimate, power vs limit, throttle."""

from __future__ import annotations

import math

from gpudiag.probe.model import GpuInfo

# Clock-event reasons that only say "idle" or "someone set the clocks": not throttling.
NOT_THROTTLING = frozenset(
    {"gpu_idle", "applications_clocks_setting", "display_clocks_setting", "none"}
)


def normalize_reason(name: str) -> str:
    """``clocks_event_reason_sw_power_cap`` / ``SW Power Cap`` -> ``sw_power_cap``."""
    text = name.strip().lower().replace(" ", "_").replace("-", "_")
    for prefix in ("clocks_event_reason_", "clocks_throttle_reason_", "clocks_event_reasons_"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def throttle_reasons(reasons: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The reasons in ``reasons`` that hold the clocks down (power, thermal, HW, sync boost)."""
    out = []
    for r in reasons:
        n = normalize_reason(r)
        if n and n not in NOT_THROTTLING:
            out.append(n)
    return tuple(out)


def peak_memory_bandwidth(info: GpuInfo) -> tuple[float | None, str]:
    """The card's peak memory bandwidth in GB/s and where the number comes from.

    First the spec table (published figure); else NVML's maximum memory clock x bus width
    x 2 (double data rate), which matches published figures for HBM and GDDR6/6X cards
    (A100 80GB: 1593 MHz x 5120 bit -> 2039 GB/s; RTX 3080: 9501 MHz x 320 bit -> 760 GB/s).
    """
    name = info.name.get()
    if name:
        from gpudiag import specs

        spec = specs.lookup_gpu(str(name))
        if spec is not None and spec.memory_bandwidth_gbps > 0:
            return float(spec.memory_bandwidth_gbps), f"spec table ({spec.name})"
    clock = info.max_memory_clock_mhz.get()
    width = info.memory_bus_width_bits.get()
    if clock and width:
        gbps = 2.0 * float(clock) * 1e6 * float(width) / 8.0 / 1e9
        return gbps, "max memory clock x bus width x 2 (NVML)"
    return None, "peak memory bandwidth unknown (not in the spec table, no bus width from NVML)"


def bandwidth_estimate(
    dram_active_pct: float, memory_util_pct: float, peak_gbps: float | None
) -> tuple[float, float, str]:
    """(achieved GB/s, % of peak, basis) from the best counter available; NaN when none.

    DRAM active (DCGM/GPM) is the share of cycles the memory interface moved data, so
    x peak it estimates achieved bandwidth. Memory-controller utilization is busy *time*
    (any access in the sample period), so the same product over-estimates: it is labelled
    a rough upper bound.
    """
    if math.isfinite(dram_active_pct):
        pct, basis = dram_active_pct, "DRAM active x peak"
    elif math.isfinite(memory_util_pct):
        pct, basis = memory_util_pct, "memory-controller utilization x peak (rough upper bound)"
    else:
        return math.nan, math.nan, "no memory activity reading"
    if peak_gbps is None or not math.isfinite(peak_gbps):
        return math.nan, pct, basis + " (peak unknown)"
    return pct / 100.0 * peak_gbps, pct, basis


def ratio_pct(value: float, limit: float | None) -> float:
    if limit is None or not math.isfinite(value) or not limit or limit <= 0:
        return math.nan
    return 100.0 * value / limit


__all__ = [
    "NOT_THROTTLING",
    "bandwidth_estimate",
    "normalize_reason",
    "peak_memory_bandwidth",
    "ratio_pct",
    "throttle_reasons",
]
