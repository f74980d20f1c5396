"""Input-pipeline rules: steps that wait on the DataLoader."""

from __future__ import annotations

from collections.abc import Iterator

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
    """The step waits on the DataLoader for more than 5 % of its time."""
    trace = evidence.trace_report
    share = trace.dataloader_share
    if share is None:
        yield NotEvaluated(
            "input.dataloader",
            "ProfilerStep ranges with DataLoader events in the trace (call prof.step() "
            "and iterate a torch DataLoader inside the profiled steps)",
        )
        return
    if share <= DATALOADER_SHARE:
        return
    steps = [s for s in trace.steps() if s.dataloader_us is not None]
    mean_step_ms = sum(s.duration_us for s in steps) / len(steps) / 1e3 if steps else None
    mean_wait_ms = sum(s.dataloader_us or 0.0 for s in steps) / len(steps) / 1e3 if steps else None
    workers = _suggested_workers(evidence)
    src = trace_source(trace)
    items = [Evidence("DataLoader share of step time", round(100 * share, 1), "%", src)]
    if mean_step_ms is not None and mean_wait_ms is not None:
        items += [
            Evidence("mean DataLoader wait per step", round(mean_wait_ms, 2), "ms", src),
            Evidence("mean step time", round(mean_step_ms, 2), "ms", src),
        ]
    yield Finding(
        "input.dataloader_bound",
        severity_for_gain(share),
        CATEGORY,
        f"the step waits on the DataLoader {share:.0%} of its time: the device starves for input",
        tuple(items),
        threshold=f"DataLoader > {DATALOADER_SHARE:.0%} of step time",
        fix=FixRef(
            "dataloader.tuning",
            {"num_workers": workers, "pin_memory": True, "persistent_workers": True},
        ),
        instruction="load and decode batches in worker processes; if workers do not help, "
        "the bottleneck is storage or decoding (pre-process the data set)",
        estimated_gain=share,
    )
