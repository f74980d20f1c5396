"""What ``gd.tune`` tries: each fix the evidence points to, with the parameter values worth trying.

Two sources, each named on the candidate: the diagnosis (a finding's recommended fix, its rule
named) and the workload itself (a DataLoader with fewer workers than cores, a batch the memory
estimate says could grow, a model ``torch.compile`` can take, the precisions the GPU supports).
A fix id given without its values (``"batch.size"``, ``"dataloader.tuning"``) is expanded into
the values worth trying here; a fix given with its values is tried as it is. What cannot be
tried live here (environment and advice fixes, a fix this machine or workload cannot take) is
skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.errors import GpuDiagError
from gpudiag.fixes import Fix

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport
    from gpudiag.rules.engine import Diagnosis
    from gpudiag.step import Workload

# Batch sizes tried: the workload's batch times these, kept while the memory estimate fits.
BATCH_FACTORS = (2, 4, 8)
# Share of the memory budget a tried batch may use by the estimate (the rest is headroom).
BATCH_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class Candidate:
    """One arm to try: its fix and why it is a candidate (the evidence it came from)."""

    fix: Fix
    source: str

    @property
    def label(self) -> str:
        return self.fix.label

    def to_dict(self) -> dict[str, Any]:
        return {"fix": self.fix.to_dict(), "label": self.label, "source": self.source}


def usable_cores() -> int:
    """CPUs this process may run on (its affinity where the OS says, else the count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def from_evidence(
    workload: Workload,
    diagnosis: Diagnosis | None,
    *,
    system: SystemReport | None,
    device_type: str,
    fixes: Sequence[Fix | str] | None = None,
    memory_budget: int | None = None,
    tried: Iterable[Fix] = (),
    from_workload: bool = True,
    nproc: int | None = None,
) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The candidates (one fix each, values expanded) and the skipped ones with the reason.

    ``fixes``: the user's set (narrows: only these ids, expanded where given without values;
    extends: ids no evidence pointed to are tried too). ``tried``: fixes already measured
    (a resumed search), left out. ``from_workload`` False: the diagnosis' fixes only (a
    re-diagnosis of the best arm). ``nproc``: fixes measured across ranks (``FixSpec.
    multi_rank``, fsdp.wrap) are candidates for the multi-rank trial, not skipped as needing a
    process group; ``fsdp.wrap`` is one when the workload has a model.
    """
    wanted: list[tuple[Fix, str]] = []
    if fixes is not None:
        for item in fixes:
            fix = Fix.coerce(item)
            wanted.append((fix, "asked for (fixes=)"))
    else:
        wanted += _from_diagnosis(diagnosis)
        if from_workload:
            wanted += _from_workload(workload, diagnosis, device_type, system)
            wanted += _when_memory_binds(workload, memory_budget)
    if nproc is not None and from_workload and fixes is None and workload.model is not None:
        wanted.append((Fix("fsdp.wrap"), f"nproc={nproc}: DDP against FSDP on {nproc} ranks"))
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    done = set(tried)
    seen: set[Fix] = set()
    for fix, source in wanted:
        for value in _values(fix, workload, device_type, memory_budget, skipped):
            if value in seen or value in done:
                continue
            seen.add(value)
            if value.spec.multi_rank:
                why = (
                    ""
                    if nproc is not None
                    else (
                        f"{value.label} is measured across ranks: gd.tune(..., nproc=N) or "
                        f"gd.compare(workload, [{value.label!r}], nproc=N)"
                    )
                )
            else:
                why = _why_not(value, workload, system, device_type)
            if why:
                skipped.append((value.label, why))
            else:
                out.append(Candidate(value, source))
    return out, skipped


def _from_diagnosis(diagnosis: Diagnosis | None) -> list[tuple[Fix, str]]:
    if diagnosis is None:
        return []
    from gpudiag.rules.finding import Severity

    out = []
    for finding in diagnosis.current():
        if finding.fix is None or finding.severity is Severity.INFO:
            continue
        out.append((finding.fix.to_fix(), f"diagnosis: {finding.rule}"))
    return out


def _from_workload(
    workload: Workload, diagnosis: Diagnosis | None, device_type: str, system: SystemReport | None
) -> list[tuple[Fix, str]]:
    """Fixes the workload's own structure calls for, each with the fact it rests on."""
    out: list[tuple[Fix, str]] = []
    loader = workload.dataloader
    workers = getattr(loader, "num_workers", None)
    cores = usable_cores()
    if loader is not None and isinstance(workers, int) and workers < cores:
        out.append(
            (
                Fix("dataloader.tuning"),
                f"workload: its DataLoader has num_workers={workers} on {cores} usable cores",
            )
        )
    if workload.owns_step and workload.model is not None:
        batch = workload.samples_per_step()
        if batch:
            out.append(
                (Fix("batch.size"), f"workload: batch {batch}; larger ones the estimate fits")
            )
        out.append(
            (Fix("compile"), "workload: a model gpudiag steps (torch.compile fuses its operators)")
        )
    if device_type == "cuda":
        for fix_id in ("precision.bf16", "precision.tf32", "cudnn.benchmark", "cuda.graphs"):
            out.append((Fix(fix_id), "hardware: a GPU that supports it"))
    return out


def _when_memory_binds(workload: Workload, memory_budget: int | None) -> list[tuple[Fix, str]]:
    """Activation checkpointing when the estimated peak at the workload's batch is over the
    memory budget (only with a budget: without one, memory does not bind a throughput search)."""
    if memory_budget is None or workload.model is None or not workload.owns_step:
        return []
    from gpudiag.analysis.memory_estimate import format_bytes

    try:
        from gpudiag.experiment.estimate import estimate_memory

        peak = estimate_memory(workload, progress=False).peak_bytes
    except Exception:  # the traced estimate could not trace this model: nothing to say
        return []
    if peak <= memory_budget:
        return []
    why = (
        f"memory: estimated peak {format_bytes(peak)} over the budget {format_bytes(memory_budget)}"
    )
    return [(Fix("activation.checkpointing"), why)]


def _values(
    fix: Fix,
    workload: Workload,
    device_type: str,
    memory_budget: int | None,
    skipped: list[tuple[str, str]],
) -> list[Fix]:
    """``fix`` as given, or expanded into the values worth trying when given without them."""
    given = dict(fix.params)
    defaults = dict(Fix(fix.id).params)
    if fix.id == "batch.size" and not given.get("micro_batch") and not given.get("global_batch"):
        return _batch_sizes(workload, memory_budget, skipped)
    if fix.id == "dataloader.tuning" and given == defaults:
        return _loader_workers(workload, device_type)
    if fix.id == "compile" and given == defaults and device_type == "cuda":
        return [Fix("compile", mode=m) for m in ("default", "max-autotune-no-cudagraphs")]
    return [fix]


def _batch_sizes(
    workload: Workload, memory_budget: int | None, skipped: list[tuple[str, str]]
) -> list[Fix]:
    batch = workload.samples_per_step() if workload.owns_step else 0
    if not batch:
        skipped.append(("batch.size", "the workload's batch size is not known"))
        return []
    sizes = [batch * k for k in BATCH_FACTORS]
    fits = _memory_filter(workload, sizes, memory_budget)
    for size, why in fits.items():
        if why:
            skipped.append((Fix("batch.size", micro_batch=size).label, why))
    return [Fix("batch.size", micro_batch=s) for s in sizes if not fits.get(s)]


def _memory_filter(
    workload: Workload, sizes: list[int], memory_budget: int | None
) -> dict[int, str]:
    """size -> why it does not fit ("" when it does, or when no estimate could tell)."""
    from gpudiag.analysis.memory_estimate import format_bytes

    try:
        from gpudiag.experiment.estimate import estimate_memory
        from gpudiag.experiment.fit import default_budget

        budget = memory_budget or default_budget(workload)[0]
        estimate = estimate_memory(workload, progress=False)
    except GpuDiagError:
        return {}
    except Exception:  # the traced estimate could not trace this model: measured trials decide
        return {}
    out = {}
    for size in sizes:
        peak = estimate.at_batch(size)
        limit = int(budget * BATCH_MEMORY_SHARE)
        out[size] = (
            f"its estimated peak {format_bytes(peak)} is over {BATCH_MEMORY_SHARE:.0%} of "
            f"the memory budget ({format_bytes(budget)}, traced estimate)"
            if peak > limit
            else ""
        )
    return out


def _loader_workers(workload: Workload, device_type: str) -> list[Fix]:
    cores = usable_cores()
    current = getattr(workload.dataloader, "num_workers", 0)
    counts = sorted({max(1, cores // 2), cores} - {current})
    pin = device_type == "cuda"
    return [Fix("dataloader.tuning", num_workers=n, pin_memory=pin) for n in counts]


def _why_not(fix: Fix, workload: Workload, system: SystemReport | None, device_type: str) -> str:
    missing = fix.missing()
    if missing:
        return missing
    blocker = fix.live_blocker() or fix.unmet_needs(workload)
    if blocker:
        return blocker
    ok, reason = fix.supported(system, device_type)
    return "" if ok else reason


__all__ = ["Candidate", "from_evidence", "usable_cores"]
