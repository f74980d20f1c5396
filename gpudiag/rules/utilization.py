"""Utilization rules over monitor samples: low or fluctuating GPU use, imbalance, CPU-bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, NotEvaluated, Severity

if TYPE_CHECKING:
    import pandas as pd

    from gpudiag.rules.evidence import Samples

CATEGORY = "utilization"

# SageMaker Debugger's LowGPUUtilization rule: p95 below 70 % is low, p5 below 10 % with a
# high p95 is fluctuating. CPUBottleneck: host CPU above 90 % while the GPU is underused.
P95_LOW = 70.0
P5_FLUCTUATING = 10.0
CPU_BUSY = 90.0
GPU_UNDERUSED = 50.0
IMBALANCE_POINTS = 30.0
MIN_SAMPLES = 10


def _frame(samples: Samples) -> pd.DataFrame | None:
    """A monitor's samples as its DataFrame (columns (device, metric)); a Monitor is read."""
    read = getattr(samples, "samples", None)
    frame = read() if callable(read) else samples
    columns = getattr(frame, "columns", None)
    if columns is None or getattr(columns, "nlevels", 1) != 2:
        return None
    return frame


def _series(frame: pd.DataFrame, metric: str) -> dict[str, Any]:
    out = {}
    for device, name in frame.columns:
        if name == metric:
            values = frame[(device, name)].dropna()
            if len(values) >= MIN_SAMPLES:
                out[str(device)] = values
    return out


def _source(frame: pd.DataFrame) -> str:
    attrs = getattr(frame, "attrs", {}) or {}
    return "monitor recording" if attrs.get("recording") else "monitor samples"


@rule("util.gpu_utilization", category=CATEGORY, needs=("samples",))
def gpu_utilization(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """GPU utilization low (p95 < 70 %) or fluctuating (p5 < 10 % with a high p95)."""
    frame = _frame(evidence.monitor_samples)
    util = _series(frame, "gpu_util_pct") if frame is not None else {}
    if not util:
        yield NotEvaluated(
            "util.gpu_utilization", f"at least {MIN_SAMPLES} GPU utilization samples"
        )
        return
    src = _source(frame)
    for device, values in util.items():
        p5, p50, p95 = (float(values.quantile(q)) for q in (0.05, 0.5, 0.95))
        items = (
            Evidence("utilization p5", round(p5, 1), "%", src),
            Evidence("utilization p50", round(p50, 1), "%", src),
            Evidence("utilization p95", round(p95, 1), "%", src),
            Evidence("samples", len(values), source=src),
        )
        if p95 < P95_LOW:
            yield Finding(
                "util.low_gpu_utilization",
                Severity.MEDIUM,
                CATEGORY,
                f"{device}: GPU utilization stays low (p95 {p95:.0f} %): the GPU waits on "
                "something else most of the time",
                items,
                threshold=f"p95 of utilization.gpu < {P95_LOW:.0f} %",
                instruction="profile a few steps (gd.diagnose(workload) or %gpudiag doctor) to "
                "see what it waits on; a bigger batch helps if nothing else does",
            )
        elif p5 < P5_FLUCTUATING:
            yield Finding(
                "util.fluctuating_gpu_utilization",
                Severity.LOW,
                CATEGORY,
                f"{device}: GPU utilization swings between {p5:.0f} % and {p95:.0f} %: "
                "periodic stalls (data loading, checkpoints, evaluation, syncs)",
                items,
                threshold=f"p5 < {P5_FLUCTUATING:.0f} % and p95 >= {P95_LOW:.0f} %",
                instruction="line the dips up with the step loop in a profile",
            )
    if len(util) >= 2:
        medians = {d: float(v.median()) for d, v in util.items()}
        low, high = min(medians, key=medians.__getitem__), max(medians, key=medians.__getitem__)
        if medians[high] - medians[low] > IMBALANCE_POINTS:
            yield Finding(
                "util.gpu_imbalance",
                Severity.MEDIUM,
                CATEGORY,
                f"GPU load is imbalanced: {high} at {medians[high]:.0f} %, {low} at "
                f"{medians[low]:.0f} % (median utilization)",
                tuple(Evidence(f"{d} median", round(m, 1), "%", src) for d, m in medians.items()),
                threshold=f"median utilization differs by > {IMBALANCE_POINTS:.0f} points",
                instruction="check that every GPU gets the same work (sharding, uneven batches, "
                "a rank doing extra logging/evaluation)",
            )


@rule("util.cpu_bottleneck", category=CATEGORY, needs=("samples",))
def cpu_bottleneck(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Host CPU saturated while the GPUs are underused."""
    frame = _frame(evidence.monitor_samples)
    if frame is None:
        return
    cpu = _series(frame, "cpu_util_pct")
    util = _series(frame, "gpu_util_pct")
    if not cpu or not util:
        return
    cpu_p50 = max(float(v.median()) for v in cpu.values())
    gpu_p50 = max(float(v.median()) for v in util.values())
    if cpu_p50 <= CPU_BUSY or gpu_p50 >= GPU_UNDERUSED:
        return
    src = _source(frame)
    yield Finding(
        "util.cpu_bottleneck",
        Severity.HIGH,
        CATEGORY,
        f"the host CPU is saturated (median {cpu_p50:.0f} %) while the GPU runs at "
        f"{gpu_p50:.0f} %: the job is CPU-bound",
        (
            Evidence("host CPU median", round(cpu_p50, 1), "%", src),
            Evidence("GPU utilization median", round(gpu_p50, 1), "%", src),
        ),
        threshold=f"CPU median > {CPU_BUSY:.0f} % and GPU median < {GPU_UNDERUSED:.0f} %",
        instruction="move preprocessing to the GPU or to DataLoader workers, and check "
        "torch.get_num_threads() against the cores this process may use",
    )
