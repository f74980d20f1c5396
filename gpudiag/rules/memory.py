"""Memory rules: over budget, headroom unused, fragmentation, reserved-but-unused, another
process on the GPU, a KV cache that dominates, a peak at the optimizer step, checkpointing that
cannot help.

They read a ``MemoryEvidence`` (what ``gd.memory``, ``gd.fit``, ``gd.estimate_memory`` and
``gd.analyze_memory_snapshot`` returned) from ``EvidenceBundle.memory``, and the system
report's GPU processes. ``memory_findings(...)`` runs just these rules.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudiag.rules.engine import Diagnosis, rule, run_rules

# MemoryEvidence lives beside EvidenceBundle (no import cycle); it stays importable from here.
from gpudiag.rules.evidence import EvidenceBundle, MemoryEvidence
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.analysis.memory_estimate import MemoryEstimate
    from gpudiag.analysis.memory_snapshot import MemorySnapshot
    from gpudiag.experiment.fit import FitResult
    from gpudiag.experiment.memory_report import MemoryReport
    from gpudiag.probe.cuda_memory import AllocatorStats
    from gpudiag.probe.system import SystemReport

CATEGORY = "memory"
HEADROOM_UNUSED = 0.5  # the peak uses less than half the budget
FRAGMENTED = 0.2  # a fifth of reserved memory cached but unused
CHECKPOINTING_USELESS = 0.05  # checkpointing saves less than 5 % of the peak
KV_DOMINATES = 0.5  # the KV cache is more than half of an inference peak


def _bytes(name: str, value: int, source: str) -> Evidence:
    return Evidence(name, round(value / 2**20, 1), "MiB", source)


@rule("memory.over_budget", category=CATEGORY, needs=("memory",))
def over_budget(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """The step runs out of memory, or its peak is above the budget."""
    mem = evidence.memory_evidence
    oom = mem.report.oom if mem.report is not None else None
    budget = mem.budget()
    fix = _fitting_fix(mem)
    if oom is not None:
        grown = oom.overflowing_category or "unknown"
        yield Finding(
            "memory.out_of_memory",
            Severity.HIGH,
            CATEGORY,
            f"the step ran out of memory: {grown} grew past the "
            f"{format_bytes(oom.budget_bytes)} budget",
            (
                _bytes("asked", oom.asked_bytes, oom.source),
                _bytes("free", max(oom.free_bytes, 0), oom.source),
                Evidence("overflowing category", grown, source=oom.source),
                *(
                    _bytes(f"live from {a.site}", a.nbytes, oom.source)
                    for a in oom.live_allocations[:2]
                ),
            ),
            threshold="an out-of-memory during the step",
            fix=fix,
            instruction="" if fix else "run gd.fit(workload, memory_budget=...) for what fits",
        )
        return
    peak = mem.peak()
    if peak is None or budget is None:
        yield NotEvaluated("memory.over_budget", "needs a peak and a memory budget")
        return
    if peak[0] > budget:
        yield Finding(
            "memory.over_budget",
            Severity.HIGH,
            CATEGORY,
            f"the step needs {format_bytes(peak[0])}, more than the {format_bytes(budget)} budget",
            (_bytes("peak", peak[0], peak[1]), _bytes("budget", budget, "given or free memory")),
            threshold="peak > budget",
            fix=fix,
            instruction="" if fix else "see gd.fit(...)'s what-if table",
        )


def _fitting_fix(mem: MemoryEvidence) -> FixRef | None:
    fit = mem.fit
    if fit is None:
        return None
    if fit.micro_batch and fit.accumulation and fit.accumulation > 1:
        return FixRef(
            "batch.size", {"micro_batch": fit.micro_batch, "accumulation": fit.accumulation}
        )
    for w in fit.whatifs:
        if (
            w.fits
            and len(w.fixes) == 1
            and w.fixes[0]
            in (
                "precision.bf16",
                "activation.checkpointing",
            )
        ):
            return FixRef(w.fixes[0])
    return None


@rule("memory.budget_headroom", category=CATEGORY, needs=("memory",))
def headroom_unused(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """The step uses less than half the memory it has: a larger batch would fit."""
    mem = evidence.memory_evidence
    peak, budget = mem.peak(), mem.budget()
    if peak is None or budget is None:
        yield NotEvaluated("memory.budget_headroom", "needs a peak and a memory budget")
        return
    if mem.report is not None and mem.report.oom is not None:
        return
    if peak[0] >= HEADROOM_UNUSED * budget:
        return
    params: dict[str, Any] = {}
    estimate = mem.fit.estimate if mem.fit is not None else mem.estimate
    larger = None
    if estimate is not None and estimate.per_sample_bytes:
        larger = estimate.largest_batch(int(0.9 * budget))
        if estimate.batch_size and larger > estimate.batch_size:
            params = {"micro_batch": larger}
    yield Finding(
        "memory.budget_headroom",
        Severity.LOW,
        CATEGORY,
        f"the step peaks at {format_bytes(peak[0])} of {format_bytes(budget)}: "
        + (f"a batch of about {larger} would fit in 90 %" if params else "room for more"),
        (_bytes("peak", peak[0], peak[1]), _bytes("budget", budget, "given or free memory")),
        threshold=f"peak < {HEADROOM_UNUSED:.0%} of the budget",
        fix=FixRef("batch.size", params) if params else None,
        instruction="" if params else "raise the batch size (retune the learning rate)",
    )


@rule("memory.fragmentation", category=CATEGORY, needs=("memory",))
def fragmentation(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Much of the reserved memory is cached in split blocks: expandable segments help."""
    mem = evidence.memory_evidence
    snap = mem.snapshot
    if snap is None:
        yield NotEvaluated("memory.fragmentation", "needs an allocator snapshot")
        return
    if not snap.reserved_bytes or snap.fragmentation < FRAGMENTED or snap.expandable_segments:
        return
    yield Finding(
        "memory.fragmentation",
        Severity.HIGH if snap.oom is not None else Severity.MEDIUM,
        CATEGORY,
        f"{snap.fragmentation:.0%} of reserved GPU memory is cached but unused "
        f"({format_bytes(snap.inactive_bytes)}, largest free block "
        f"{format_bytes(snap.largest_inactive_block)})",
        (
            _bytes("reserved", snap.reserved_bytes, f"snapshot {snap.source}"),
            _bytes("allocated", snap.allocated_bytes, f"snapshot {snap.source}"),
            _bytes("inactive split", snap.inactive_split_bytes, f"snapshot {snap.source}"),
        ),
        threshold=f"(reserved - active) >= {FRAGMENTED:.0%} of reserved, expandable segments off",
        fix=FixRef("allocator.config", {"expandable_segments": True}),
    )


@rule("memory.reserved_unused", category=CATEGORY, needs=("memory",))
def reserved_unused(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """The caching allocator holds much more than live tensors, and has had to retry."""
    stats = evidence.memory_evidence.allocator
    if stats is None:
        yield NotEvaluated("memory.reserved_unused", "needs torch.cuda.memory_stats (a GPU)")
        return
    unused = stats.reserved_unused_bytes
    if not stats.reserved_bytes or unused < FRAGMENTED * stats.reserved_bytes:
        return
    retries = stats.num_alloc_retries
    yield Finding(
        "memory.reserved_unused",
        Severity.MEDIUM if retries else Severity.LOW,
        CATEGORY,
        f"{format_bytes(unused)} reserved but not in live tensors"
        + (f"; the allocator flushed its cache and retried {retries} times" if retries else ""),
        (
            _bytes("reserved", stats.reserved_bytes, "torch.cuda.memory_stats"),
            _bytes("allocated", stats.allocated_bytes, "torch.cuda.memory_stats"),
            Evidence("num_alloc_retries", retries, source="torch.cuda.memory_stats"),
        ),
        threshold=f"reserved - allocated >= {FRAGMENTED:.0%} of reserved",
        fix=FixRef("allocator.config", {"expandable_segments": True}),
    )


@rule("memory.other_process", category=CATEGORY, needs=("gpu", "memory"))
def other_process(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Another process holds memory on a GPU this job uses."""
    mem = evidence.memory_evidence
    own = mem.pid if mem.pid is not None else os.getpid()
    for gpu in evidence.system_report.gpus:
        procs = gpu.state.processes.get(None) or ()
        others = [p for p in procs if p.pid != own]
        if not others:
            continue
        held = [(p, p.used_memory_bytes.get(None)) for p in others]
        known = [(p, int(b)) for p, b in held if b]
        total = sum(b for _, b in known)
        if known:
            p, b = max(known, key=lambda pb: pb[1])
            what = (
                f"hold {format_bytes(total)}; the largest is pid {p.pid} "
                f"{os.path.basename(p.name) or '(no name)'} ({format_bytes(b)})"
            )
        else:
            what = "hold memory the recording does not say (nvidia-smi printed N/A)"
        yield Finding(
            "memory.other_process",
            Severity.MEDIUM if total >= 2**30 else Severity.INFO,
            CATEGORY,
            f"{len(others)} other process(es) on GPU {gpu.info.index} {what}",
            tuple(
                _bytes(f"pid {q.pid} {os.path.basename(q.name)}", n, "nvml processes")
                if n
                else Evidence(f"pid {q.pid} {os.path.basename(q.name)}", "N/A", "", "nvml")
                for q, n in held[:4]
            ),
            threshold="a process other than this one uses GPU memory",
            instruction="stop the other processes, or pick another GPU (CUDA_VISIBLE_DEVICES)",
        )


@rule("memory.kv_cache_dominates", category=CATEGORY, needs=("memory",))
def kv_cache_dominates(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Generation memory is mostly KV cache: batch x sequence, not the model, is the limit."""
    est = evidence.memory_evidence.estimate
    if est is None or not est.peak_bytes:
        return
    kv = int(est.breakdown.get("kv_cache", 0))
    if kv < KV_DOMINATES * est.peak_bytes:
        return
    yield Finding(
        "memory.kv_cache_dominates",
        Severity.MEDIUM,
        CATEGORY,
        f"the KV cache is {kv / est.peak_bytes:.0%} of the inference peak "
        f"({format_bytes(kv)} at batch {est.batch_size}, sequence {est.seq_len})",
        (
            _bytes("kv cache", kv, f"gd.estimate_memory ({est.route})"),
            _bytes("peak", est.peak_bytes, f"gd.estimate_memory ({est.route})"),
        ),
        threshold=f"KV cache > {KV_DOMINATES:.0%} of the peak",
        instruction="cap batch x sequence, use grouped-query attention or a paged / "
        "quantized (fp8) KV cache, or shard it over tensor-parallel ranks",
    )


@rule("memory.optimizer_step_peak", category=CATEGORY, needs=("memory",))
def optimizer_step_peak(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The peak is Adam's update, not the forward or backward: fused=True lowers it."""
    est = evidence.memory_evidence.estimate
    if est is None or est.peak_phase != "optimizer step":
        return
    update = int(est.breakdown.get("temporaries", 0))
    backward = int(est.step_peaks.get("backward", 0))
    if update <= 0 or not est.peak_bytes:
        return
    lowered = max(est.peak_bytes - update, backward)
    src = f"gd.estimate_memory ({est.route})"
    yield Finding(
        "memory.optimizer_step_peak",
        Severity.MEDIUM if (est.peak_bytes - lowered) >= 0.1 * est.peak_bytes else Severity.LOW,
        CATEGORY,
        f"the peak is the optimizer step ({format_bytes(est.peak_bytes)}), not the backward "
        f"({format_bytes(backward)}): {est.optimizer}'s default foreach update holds "
        f"{format_bytes(update)} more, one fp32 copy of the parameters it updates",
        (
            _bytes("peak at the optimizer step", est.peak_bytes, src),
            _bytes("of it, the update's copy", update, src),
            _bytes("peak of the backward", backward, src),
            _bytes("peak with fused=True (about)", lowered, src),
        ),
        threshold="the estimate's optimizer-step peak above its backward peak",
        instruction=f"build the optimizer with fused=True (torch.optim.{_optimizer_class(est)}"
        "(params, ..., fused=True), CUDA) or foreach=False: the update then holds about one "
        "tensor at a time; activation checkpointing or a smaller batch would not lower this peak",
    )


def _optimizer_class(est: MemoryEstimate) -> str:
    return {"adam": "Adam", "adamw": "AdamW"}.get(est.optimizer, "AdamW")


@rule("memory.checkpointing_cannot_help", category=CATEGORY, needs=("memory",))
def checkpointing_cannot_help(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Activation checkpointing is applied (or proposed) where it saves almost nothing."""
    mem = evidence.memory_evidence
    if mem.fit is not None:
        rows = {w.label: w for w in mem.fit.whatifs}
        base = next(iter(rows.values()), None)
        ckpt = rows.get("activation checkpointing")
        if base and ckpt and base.peak_bytes and ckpt.peak_bytes is not None:
            saving = 1 - ckpt.peak_bytes / base.peak_bytes
            if saving < CHECKPOINTING_USELESS:
                yield _useless(saving, base.peak_bytes, ckpt.peak_bytes, "gd.fit what-if")
        return
    report = mem.report
    if report is None or "activation.checkpointing" not in " ".join(report.fixes):
        return
    acts = report.at_peak.get("activations", 0)
    if report.peak_bytes and acts < CHECKPOINTING_USELESS * report.peak_bytes:
        yield _useless(
            None, report.peak_bytes, report.peak_bytes, "gd.memory with activation.checkpointing"
        )


def _useless(saving: float | None, base: int, ckpt: int, source: str) -> Finding:
    what = f"saves {saving:.1%} of the peak" if saving is not None else "leaves few activations"
    return Finding(
        "memory.checkpointing_cannot_help",
        Severity.LOW,
        CATEGORY,
        f"activation checkpointing {what}: the peak is not made of stored activations "
        "(optimizer step, parameters or one large layer), and it costs a recomputed forward",
        (_bytes("peak without", base, source), _bytes("peak with", ckpt, source)),
        threshold=f"saving < {CHECKPOINTING_USELESS:.0%} of the peak",
        instruction="leave checkpointing off; shrink what the peak is made of instead "
        "(see the categories at the peak)",
    )


def memory_findings(
    *,
    report: MemoryReport | None = None,
    fit: FitResult | None = None,
    estimate: MemoryEstimate | None = None,
    snapshot: MemorySnapshot | None = None,
    budget_bytes: int | None = None,
    allocator: AllocatorStats | None = None,
    system: SystemReport | None = None,
) -> Diagnosis:
    """Run the memory rules alone over what gd.memory / gd.fit / snapshots returned."""
    evidence = EvidenceBundle(
        system=system,
        memory=MemoryEvidence(report, fit, estimate, snapshot, budget_bytes, allocator),
        env={},
    )
    ids = [
        "memory.over_budget",
        "memory.budget_headroom",
        "memory.fragmentation",
        "memory.reserved_unused",
        "memory.kv_cache_dominates",
        "memory.optimizer_step_peak",
        "memory.checkpointing_cannot_help",
    ]
    if system is not None:
        ids.append("memory.other_process")
    return run_rules(evidence, only=ids)
