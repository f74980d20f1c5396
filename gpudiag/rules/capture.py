"""Capture rules: what the trace itself can and cannot stand for (a warm-up, missing kernels)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.trace.ledger import WARMUP_IDLE
from gpudiag.rules._claims import ledger_of
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity

CATEGORY = "trace"

# A capture whose time ledger is this much compilation, graph capture or first-iteration work
# describes the warm-up, not the steady state (high from WARMUP_HIGH).
WARMUP_SHARE = 0.20
WARMUP_HIGH = 0.50


@rule("capture.warmup", category=CATEGORY, needs=("gpu_trace",))
def warmup_capture(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The capture is mostly warm-up: compilation, graph capture, lazy initialisation."""
    trace = evidence.trace_report
    ledger = ledger_of(trace)
    if ledger is None:
        return
    share = ledger.share(WARMUP_IDLE)
    if share < WARMUP_SHARE:
        return
    row = ledger.row(WARMUP_IDLE)
    behind = row.host_events if row is not None else ()
    src = trace_source(trace)
    items = [
        Evidence(
            "time-ledger row: idle in compilation, graph capture, warm-up",
            round(ledger.us(WARMUP_IDLE) / 1e3, 2),
            f"ms, {share:.1%} of the window",
            src,
        ),
        *(Evidence(f"host in {name}", round(us / 1e3, 2), "ms", src) for name, us in behind[:4]),
    ]
    what = f" ({', '.join(name for name, _ in behind[:2])})" if behind else ""
    yield Finding(
        "trace.warmup",
        Severity.HIGH if share >= WARMUP_HIGH else Severity.MEDIUM,
        CATEGORY,
        f"this capture is a warm-up: the GPU sits idle {share:.0%} of it while the host "
        f"compiles, captures graphs or initialises{what}, so it does not show the steady "
        "state: profile later steps",
        tuple(items),
        threshold=f"the time ledger's warm-up row >= {WARMUP_SHARE:.0%} of the profiled time "
        f"(high from {WARMUP_HIGH:.0%}); the other findings' gains leave that time out",
        instruction="profile later steps: torch.profiler.schedule(wait=1, warmup=2, active=3) "
        "with prof.step() once per step, so that torch.compile's compilation, CUDA-graph "
        "recording, cuDNN autotuning and lazy initialisation happen before the recorded steps",
        claims=(WARMUP_IDLE,),
    )


@rule("capture.kernels_missing", category=CATEGORY, needs=("trace",))
def kernels_missing(evidence: EvidenceBundle) -> Iterator[Finding]:
    """A GPU run whose kernel records are missing (not a CPU-only run)."""
    trace = evidence.trace_report
    missing = [r for r in trace.ranks if r.kernels_missing]
    if not missing:
        return
    src = trace_source(trace)
    note = missing[0].kernels_missing or ""
    yield Finding(
        "trace.kernels_missing",
        Severity.HIGH,
        CATEGORY,
        "the trace's GPU kernel records are missing: the host launched kernels on "
        f"{len(missing[0].devices) or 'its'} GPUs, and none was recorded, so nothing about the "
        "GPU's time can be told",
        (
            Evidence("ranks without kernel records", len(missing), f"of {len(trace.ranks)}", src),
            Evidence("what the trace shows", note, source=src),
        ),
        threshold="kernel launches on the host and no kernel events in the trace",
        instruction="profile again with activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA] and fewer active steps (schedule active=1-3), or raise the "
        "activity buffer (ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB in a Kineto config file named by "
        "KINETO_CONFIG)",
    )
