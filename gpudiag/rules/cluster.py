"""Rules over the samples of many GPUs (a cluster through Prometheus or dcgm-exporter): a
straggler, one node throttled, XID and ECC errors, memory full on some ranks only, idle
tensor pipes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity

if TYPE_CHECKING:
    import pandas as pd

    from gpudiag.rules.evidence import Samples

CATEGORY = "cluster"
MIN_SAMPLES = 5
# A GPU lags when its median SM activity sits this many points under the median of all GPUs
# (and 3 scaled MADs, so a noisy job does not flag its own spread), while the rest are busy.
STRAGGLER_POINTS = 20.0
STRAGGLER_BUSY = 30.0
MIN_GPUS_FOR_STRAGGLER = 3
THROTTLED_SHARE = 0.2  # of the samples
CLOCK_GAP = 0.05  # a throttled node's SM clock this far under the others' holds the job back
MEMORY_FULL_PCT = 95.0
MEMORY_ROOM_PCT = 85.0
TENSOR_IDLE_PCT = 1.0
SM_BUSY_PCT = 30.0

# What an XID code means (NVIDIA's "XID Errors" table, docs.nvidia.com/deploy/xid-errors).
XID_MEANING: dict[int, str] = {
    13: "graphics engine exception (often an out-of-range access in a kernel)",
    31: "GPU memory page fault (often an illegal address in a kernel)",
    43: "the GPU stopped processing (a kernel fault, often from the application)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def _frame(samples: Samples) -> pd.DataFrame | None:
    read = getattr(samples, "samples", None)  # a Monitor, or its DataFrame already
    frame = read() if callable(read) else samples
    columns = getattr(frame, "columns", None)
    if columns is None or getattr(columns, "nlevels", 1) != 2:
        return None
    return frame


def _per_device(frame: pd.DataFrame, metric: str) -> dict[str, Any]:
    out = {}
    for device, name in frame.columns:
        if name == metric:
            values = frame[(device, name)].dropna()
            if len(values) >= MIN_SAMPLES:
                out[str(device)] = values
    return out


def _host(frame: pd.DataFrame, device: str) -> str:
    hosts = (getattr(frame, "attrs", {}) or {}).get("hosts") or {}
    if device in hosts:
        return str(hosts[device])
    return device.split("/", 1)[0] if "/" in device else ""


def _source(frame: pd.DataFrame) -> str:
    label = str((getattr(frame, "attrs", {}) or {}).get("label", "")).strip()
    return f"monitor: {label}" if label else "monitor samples"


def _activity(frame: pd.DataFrame) -> tuple[str, dict[str, Any]]:
    """SM activity per GPU, or the best stand-in an exporter gives (said in the evidence)."""
    for metric in ("sm_active_pct", "gr_engine_active_pct", "gpu_util_pct"):
        series = _per_device(frame, metric)
        if len(series) >= 2:
            return metric, series
    return "", {}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


@rule("cluster.straggler", category=CATEGORY, needs=("samples",))
def straggler(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """One GPU, or every GPU of one node, lags the others in SM activity while they are busy."""
    frame = _frame(evidence.monitor_samples)
    metric, series = _activity(frame) if frame is not None else ("", {})
    if frame is None or len(series) < MIN_GPUS_FOR_STRAGGLER:
        yield NotEvaluated(
            "cluster.straggler",
            f"SM activity of at least {MIN_GPUS_FOR_STRAGGLER} GPUs, {MIN_SAMPLES}+ samples each",
        )
        return
    medians = {d: float(v.median()) for d, v in series.items()}
    overall = _median(list(medians.values()))
    mad = 1.4826 * _median([abs(m - overall) for m in medians.values()])
    gap = max(STRAGGLER_POINTS, 3.0 * mad)
    if overall < STRAGGLER_BUSY:
        return
    lagging = {d: m for d, m in medians.items() if overall - m > gap}
    if not lagging or len(lagging) > len(medians) // 2:
        return  # nobody lags, or half the job does: not one straggler
    by_host: dict[str, list[str]] = {}
    for d in medians:
        by_host.setdefault(_host(frame, d), []).append(d)
    src = _source(frame)
    reported: set[str] = set()
    for host, devices in by_host.items():
        if host and len(devices) > 1 and all(d in lagging for d in devices):
            reported.update(devices)
            yield _straggler_finding(
                f"node {host}", devices, medians, overall, mad, metric, series, src
            )
    for d in lagging:
        if d not in reported:
            yield _straggler_finding(d, [d], medians, overall, mad, metric, series, src)


def _straggler_finding(
    who: str,
    devices: list[str],
    medians: dict[str, float],
    overall: float,
    mad: float,
    metric: str,
    series: dict[str, Any],
    src: str,
) -> Finding:
    own = _median([medians[d] for d in devices])
    stand_in = "" if metric == "sm_active_pct" else f" ({metric}: SM active is not exported)"
    items = (
        Evidence(f"{who} median {metric}", round(own, 1), "%", src),
        Evidence(f"median of all {len(medians)} GPUs", round(overall, 1), "%", src),
        Evidence("spread of the GPUs (scaled MAD)", round(mad, 1), "points", src),
        Evidence("samples per GPU", min(len(series[d]) for d in devices), source=src),
    )
    return Finding(
        "cluster.straggler",
        Severity.HIGH if overall - own > 2 * STRAGGLER_POINTS else Severity.MEDIUM,
        CATEGORY,
        f"{who} lags: SM activity {own:.0f} % against {overall:.0f} % on the other GPUs"
        f"{stand_in}; in a synchronous job every step waits for the slowest rank",
        items,
        threshold=f"median {overall:.0f} % - GPU median > max({STRAGGLER_POINTS:.0f} points, "
        "3 MADs) while the median is over "
        f"{STRAGGLER_BUSY:.0f} %",
        instruction=f"look at {who} alone (pick it in the monitor's rows menu): throttled "
        "clocks, a slower input pipeline or CPU, its network link; profile that rank "
        "(gd.diagnose on it) to see what it waits on",
    )


@rule("cluster.throttled_node", category=CATEGORY, needs=("samples",))
def throttled_node(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Clocks held down on some nodes only (power cap, thermal, HW slowdown), on GPUs that
    are busy or clocked under the rest."""
    frame = _frame(evidence.monitor_samples)
    flags = _per_device(frame, "throttled") if frame is not None else {}
    if frame is None or len(flags) < 2:
        yield NotEvaluated("cluster.throttled_node", "the throttle flag of at least 2 GPUs")
        return
    share = {d: float((v >= 0.5).mean()) for d, v in flags.items()}
    hosts = {d: _host(frame, d) for d in share}
    throttled = {d for d, s in share.items() if s >= THROTTLED_SHARE}
    nodes = set(hosts.values())
    hot_nodes = {hosts[d] for d in throttled}
    if not throttled or (len(hot_nodes) > max(1, len(nodes) // 2) and len(nodes) > 1):
        return  # none, or most of the cluster: a site-wide cap, not one node
    clocks = _per_device(frame, "sm_clock_mhz")
    util = _per_device(frame, "gpu_util_pct")
    reasons = _throttle_reasons(evidence.monitor_samples)
    src = _source(frame)
    for node in sorted(hot_nodes):
        devices = sorted(d for d in throttled if hosts[d] == node)
        mine = [float(clocks[d].median()) for d in devices if d in clocks]
        rest = [float(v.median()) for d, v in clocks.items() if d not in throttled]
        busy = [float(util[d].median()) for d in devices if d in util]
        slower = bool(mine and rest) and _median(mine) < (1 - CLOCK_GAP) * _median(rest)
        if not slower and not (busy and _median(busy) >= STRAGGLER_BUSY):
            # An idle GPU with a clock-event reason set (the recorded RTX 3090 idles at
            # 210 MHz under sw_power_cap, as fast as the rest): it holds nobody up.
            continue
        items = [
            Evidence(f"{d} throttled", round(100 * share[d], 1), "% of samples", src)
            for d in devices
        ]
        if mine and rest:
            items.append(Evidence(f"{node} SM clock median", round(_median(mine)), "MHz", src))
            items.append(Evidence("other GPUs SM clock median", round(_median(rest)), "MHz", src))
        why = sorted({r for d in devices for r in reasons.get(d, ())})
        if why:
            items.append(Evidence("clock-event reasons", ", ".join(why), source=src))
        where = f"node {node}" if node else ", ".join(devices)
        yield Finding(
            "cluster.throttled_node",
            Severity.HIGH,
            CATEGORY,
            f"clocks throttled on {where} ({len(devices)} GPU{'s' if len(devices) > 1 else ''})"
            " while the other nodes run free: the whole job runs at that node's pace",
            tuple(items),
            threshold=f"throttled in >= {THROTTLED_SHARE:.0%} of the samples on some nodes only",
            instruction="check that node's power limit and cooling (nvidia-smi -q -d "
            "PERFORMANCE,POWER,TEMPERATURE there); drain it or fix the cap",
        )


def _throttle_reasons(samples: Samples) -> dict[str, tuple[str, ...]]:
    from gpudiag.monitoring.sampler import Monitor

    if not isinstance(samples, Monitor):
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for event in samples.throttle_events():
        out[event.device] = tuple(dict.fromkeys((*out.get(event.device, ()), *event.reasons)))
    return out


@rule("cluster.gpu_errors", category=CATEGORY, needs=("samples",))
def gpu_errors(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """XID errors, uncorrected ECC errors or remapped rows reported for a GPU."""
    frame = _frame(evidence.monitor_samples)
    xids = _per_device(frame, "xid_last") if frame is not None else {}
    ecc = _per_device(frame, "ecc_uncorrected_volatile") if frame is not None else {}
    rows = _per_device(frame, "remapped_rows_uncorrectable") if frame is not None else {}
    if frame is None or not (xids or ecc or rows):
        yield NotEvaluated(
            "cluster.gpu_errors",
            "XID or ECC counts (DCGM_FI_DEV_XID_ERRORS, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) from "
            "dcgm-exporter or Prometheus",
        )
        return
    src = _source(frame)
    for device, values in xids.items():
        codes = sorted({int(x) for x in values if math.isfinite(x) and x > 0})
        if not codes:
            continue
        meaning = "; ".join(f"XID {c}: {XID_MEANING.get(c, 'see the XID table')}" for c in codes)
        yield Finding(
            "cluster.xid_error",
            Severity.HIGH,
            CATEGORY,
            f"{device} reported {', '.join(f'XID {c}' for c in codes)}: {meaning}",
            (Evidence(f"{device} last XID", codes[-1], source=src + " (DCGM_FI_DEV_XID_ERRORS)"),),
            threshold="DCGM_FI_DEV_XID_ERRORS > 0",
            instruction=f"read the driver log on {_host(frame, device) or 'that node'} "
            "(dmesg | grep -i xid); a hardware XID (48, 63, 64, 74, 79, 92, 94, 95) means "
            "draining the node and resetting or replacing the GPU",
        )
    for metric, label, words in (
        (ecc, "uncorrected ECC errors", "a job touching that memory gets corrupted data or dies"),
        (rows, "rows remapped after uncorrectable errors", "a GPU reset applies the remap"),
    ):
        for device, values in metric.items():
            peak = float(values.max())
            if peak <= 0:
                continue
            rise = peak - float(values.iloc[0])
            yield Finding(
                "cluster.ecc_error",
                Severity.HIGH,
                CATEGORY,
                f"{device}: {peak:.0f} {label}"
                + (f", {rise:.0f} during the run" if rise else "")
                + f": {words}",
                (
                    Evidence(f"{device} {label}", peak, source=src),
                    Evidence("rise while monitored", rise, source=src),
                ),
                threshold=f"{label} > 0",
                instruction="drain the node and run `dcgmi diag -r 3` on that GPU; replace it "
                "if the count keeps rising",
            )


@rule("cluster.memory_some_ranks", category=CATEGORY, needs=("samples",))
def memory_some_ranks(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """GPU memory nearly full on some GPUs only, with room on the others."""
    frame = _frame(evidence.monitor_samples)
    used = _per_device(frame, "memory_used_pct") if frame is not None else {}
    if frame is None or len(used) < 2:
        yield NotEvaluated("cluster.memory_some_ranks", "memory use of at least 2 GPUs")
        return
    peaks = {d: float(v.max()) for d, v in used.items()}
    full = {d: p for d, p in peaks.items() if p >= MEMORY_FULL_PCT}
    roomy = {d: p for d, p in peaks.items() if p < MEMORY_ROOM_PCT}
    if not full or not roomy:
        return
    src = _source(frame)
    shown = sorted(full, key=full.__getitem__, reverse=True)[:8]
    items = [Evidence(f"{d} peak memory used", round(full[d], 1), "%", src) for d in shown]
    items.append(
        Evidence(
            f"median peak of the other {len(peaks) - len(full)} GPUs",
            round(_median([p for d, p in peaks.items() if d not in full]), 1),
            "%",
            src,
        )
    )
    yield Finding(
        "cluster.memory_some_ranks",
        Severity.MEDIUM,
        CATEGORY,
        f"memory nearly full on {len(full)} of {len(peaks)} GPUs only "
        f"({', '.join(shown)}{' ...' if len(full) > len(shown) else ''}): those ranks hold "
        "more than the rest and will run out first",
        tuple(items),
        threshold=f"peak >= {MEMORY_FULL_PCT:.0f} % on some GPUs, < {MEMORY_ROOM_PCT:.0f} % "
        "on others",
        instruction="find what those ranks keep that others do not (rank 0's logging or "
        "evaluation, an unbalanced pipeline stage, uneven sequence lengths); gd.memory on "
        "that rank breaks its peak down",
    )


@rule("cluster.tensor_cores_idle", category=CATEGORY, needs=("samples",))
def tensor_cores_idle(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Tensor pipes near idle on every GPU while their SMs are busy: fp32 matmuls."""
    frame = _frame(evidence.monitor_samples)
    tensor = _per_device(frame, "tensor_active_pct") if frame is not None else {}
    metric, busy = _activity(frame) if frame is not None else ("", {})
    if not busy and frame is not None:
        metric, busy = "gpu_util_pct", _per_device(frame, "gpu_util_pct")
    both = [d for d in tensor if d in busy]
    if frame is None or not both:
        yield NotEvaluated(
            "cluster.tensor_cores_idle",
            "tensor-pipe activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) and SM activity",
        )
        return
    t_med = {d: float(tensor[d].median()) for d in both}
    s_med = {d: float(busy[d].median()) for d in both}
    working = [d for d in both if s_med[d] >= SM_BUSY_PCT]
    if not working or any(t_med[d] >= TENSOR_IDLE_PCT for d in working):
        return
    src = _source(frame)
    yield Finding(
        "cluster.tensor_cores_idle",
        Severity.MEDIUM,
        CATEGORY,
        f"tensor pipes idle on {len(working)} busy GPU{'s' if len(working) > 1 else ''} "
        f"(median {max(t_med[d] for d in working):.1f} % at most, {metric} "
        f"{_median([s_med[d] for d in working]):.0f} %): the math runs without tensor cores "
        "(fp32 matmuls, no TF32 or bf16)",
        (
            Evidence(
                "tensor pipe active, highest GPU median", max(t_med[d] for d in working), "%", src
            ),
            Evidence(f"{metric}, median over GPUs", _median([s_med[d] for d in working]), "%", src),
            Evidence("GPUs", len(working), source=src),
        ),
        threshold=f"tensor active < {TENSOR_IDLE_PCT:g} % on every GPU whose {metric} >= "
        f"{SM_BUSY_PCT:.0f} %",
        fix=FixRef("precision.bf16"),
        instruction="if the job does matmuls or convolutions, bf16 autocast (or TF32 for "
        "fp32 code) puts them on the tensor cores; a job without them has nothing to change",
    )
