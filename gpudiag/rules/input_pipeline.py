"""Input-pipeline rules: steps that wait on the DataLoader."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.trace.ledger import DATALOADER_IDLE
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import (
    Evidence,
    Finding,
    FixRef,
    NotEvaluated,
    severity_for_gain,
)

CATEGORY = "input pipeline"

DATALOADER_SHARE = 0.05  # torch-tb-profiler: "DataLoader > 5 % of step time"
# Workers load the next batches while the step runs (torch.utils.data: num_workers,
# prefetch_factor): at best the GPU never waits for data again. Measured on the kineto
# resnet50 pair in the fixtures: num_workers 0 -> 4 took the DataLoader's row of the time
# ledger from 28.7 % of the window to under 0.1 %.
_WORKERS_REMOVE = 1.0
_WORKERS_SOURCE = (
    "DataLoader workers prefetch while the GPU runs (torch.utils.data); kineto resnet50 "
    "samples: num_workers 0 -> 4 took this row from 28.7 % to 0.01 % of the window"
)


def _suggested_workers(evidence: EvidenceBundle) -> int:
    """Worker processes per GPU: the host's cores shared by its GPUs, between 2 and 8."""
    system = evidence.system
    cores = system.host.logical_cores.get() if system is not None else None
    gpus = max(1, len(system.gpus)) if system is not None else 1
    if not cores:
        return 4
    return max(2, min(8, int(cores) // gpus - 1))


@rule("input.dataloader", category=CATEGORY, needs=("trace",))
def dataloader_wait(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """The GPU waits on the DataLoader for more than 5 % of the profiled time.

    On a GPU trace this is the time ledger's DataLoader row (the GPU idle while the host is in
    the DataLoader's ``__next__``), which needs no ProfilerStep ranges; on a CPU-only trace, the
    steps' share of time in the DataLoader."""
    trace = evidence.trace_report
    src = trace_source(trace)
    found = claim(trace, (DATALOADER_IDLE,), _WORKERS_REMOVE, _WORKERS_SOURCE)
    share = trace.dataloader_share
    if found is not None and DATALOADER_IDLE not in trace.ledger().recorded:
        found = None  # no DataLoader events at all: not "no wait", but "cannot tell"
        share = None
    if found is not None:
        if found.row_share <= DATALOADER_SHARE:
            return
        gain = found.gain
        items = list(found.evidence(src))
        what = "the GPU idles waiting on the DataLoader"
        threshold = (
            f"time-ledger row 'waiting on the DataLoader' > {DATALOADER_SHARE:.0%} of the window "
            "(GPU idle while the host is in the DataLoader's __next__)"
        )
    elif share is not None:
        if share <= DATALOADER_SHARE:
            return
        gain = share
        items = [Evidence("DataLoader share of step time", round(100 * share, 1), "%", src)]
        what = "the step waits on the DataLoader"
        threshold = f"DataLoader > {DATALOADER_SHARE:.0%} of step time (CPU-only trace)"
    else:
        yield NotEvaluated(
            "input.dataloader",
            "DataLoader events in the trace (iterate a torch DataLoader inside the profiled code)",
        )
        return
    steps = [s for s in trace.steps() if s.in_window and s.dataloader_us is not None]
    if steps:
        items += [
            Evidence(
                "host time in the DataLoader, share of step time",
                round(100 * (share or 0.0), 1),
                "%",
                src,
            ),
            Evidence(
                "mean DataLoader wait per step",
                round(sum(s.dataloader_us or 0.0 for s in steps) / len(steps) / 1e3, 2),
                "ms",
                src,
            ),
            Evidence(
                "mean step time",
                round(sum(s.duration_us for s in steps) / len(steps) / 1e3, 2),
                "ms",
                src,
            ),
        ]
    workers = _suggested_workers(evidence)
    yield Finding(
        "input.dataloader_bound",
        severity_for_gain(gain),
        CATEGORY,
        f"{what} {gain:.0%} of the time: the device starves for input",
        tuple(items),
        threshold=threshold,
        fix=FixRef(
            "dataloader.tuning",
            {"num_workers": workers, "pin_memory": True, "persistent_workers": True},
        ),
        instruction="load and decode batches in worker processes; if workers do not help, "
        "the bottleneck is storage or decoding (pre-process the data set)",
        estimated_gain=gain,
        claims=(DATALOADER_IDLE,) if found is not None else (),
    )
