"""``gd.fit``: the largest micro-batch that fits a memory budget, and what else would fit.

The traced estimate (nothing allocated) gives the bytes each sample adds; the largest
micro-batch that divides the workload's batch and fits is then confirmed by one measured step
under the same budget (``gd.memory(budget=...)``, the user's state restored), stepping down
after an out-of-memory. Gradient accumulation keeps the global batch: the answer is a
``batch.size`` fix with ``micro_batch`` and ``accumulation``. The what-if table gives, for each
change a recipe can carry (each row a fix id), the peak it would give and whether it fits.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._deadline import user_code_failures
from gpudiag._progress import ProgressFn, Stages, closed_on_error, resolve
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.analysis.memory_estimate import MemoryEstimate, with_parallelism
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.estimate import estimate_memory
from gpudiag.experiment.memory_report import capped_peak, parse_budget
from gpudiag.experiment.step_limit import shared_limits
from gpudiag.fixes import Fix
from gpudiag.fixes import _system as fix_system
from gpudiag.probe import cuda
from gpudiag.step import Workload, WorkloadError
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport


@dataclass(frozen=True)
class WhatIf:
    """One option: the fixes it applies, the peak it would give, whether that fits."""

    label: str
    fixes: tuple[str, ...]
    peak_bytes: int | None
    fits: bool | None
    source: str  # "traced estimate", "estimate + parallelism", "not available: ..."
    breakdown: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FitResult(Carded):
    """``gd.fit``'s answer: micro-batch, accumulation, the confirming step, the what-ifs."""

    workload: str
    budget_bytes: int
    budget_source: str
    global_batch: int
    micro_batch: int | None  # None: not even one sample fits as is
    accumulation: int | None
    confirmed: bool  # a measured step at micro_batch stayed within the budget
    measured_peak_bytes: int | None
    estimate: MemoryEstimate
    whatifs: tuple[WhatIf, ...]
    notes: tuple[str, ...] = ()
    # The largest batch the estimate says fits the budget (beyond the workload's own batch,
    # which micro_batch never exceeds); None when the step's memory does not scale with it.
    largest_batch: int | None = None

    @property
    def fix(self) -> Fix | None:
        """The ``batch.size`` fix that keeps the global batch (None when it already fits)."""
        if self.micro_batch is None or self.accumulation is None or self.accumulation == 1:
            return None
        return Fix("batch.size", micro_batch=self.micro_batch, accumulation=self.accumulation)

    def fitting(self) -> list[WhatIf]:
        return [w for w in self.whatifs if w.fits]

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "fit",
                "workload": self.workload,
                "budget_bytes": self.budget_bytes,
                "budget_source": self.budget_source,
                "global_batch": self.global_batch,
                "micro_batch": self.micro_batch,
                "accumulation": self.accumulation,
                "largest_batch": self.largest_batch,
                "fix": None if self.fix is None else self.fix.to_dict(),
                "confirmed": self.confirmed,
                "measured_peak_bytes": self.measured_peak_bytes,
                "estimate": self.estimate,
                "whatifs": self.whatifs,
                "notes": list(self.notes),
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def _summary(self) -> str:
        if self.micro_batch is None:
            return "not even one sample fits as is: see the what-if table"
        if self.accumulation == 1:
            room = (
                f"; by the estimate up to {self.largest_batch} samples a step would fit"
                if self.largest_batch and self.largest_batch > self.global_batch
                else ""
            )
            return f"the batch of {self.global_batch} fits as is{room}"
        return (
            f"micro-batch {self.micro_batch} x {self.accumulation} accumulation steps keeps the "
            f"batch of {self.global_batch} (fix batch.size)"
        )

    def _rows(self) -> list[tuple[str, str, str, str, str]]:
        return [
            (
                w.label,
                ", ".join(w.fixes) or "-",
                format_bytes(w.peak_bytes),
                {True: "fits", False: "too big", None: "n/a"}[w.fits],
                w.source,
            )
            for w in self.whatifs
        ]

    def __repr__(self) -> str:
        lines = [
            f"FitResult({self.workload}: budget {format_bytes(self.budget_bytes)} "
            f"({self.budget_source}); {self._summary()}"
            + ("; confirmed by a measured step)" if self.confirmed else ")")
        ]
        lines += [f"  {a:<28} {c:>12}  {d:<8} {b}" for a, b, c, d, _ in self._rows()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        head = Facts(
            [
                ("budget", f"{format_bytes(self.budget_bytes)} ({self.budget_source})"),
                ("answer", self._summary()),
                ("confirmed", "by a measured step" if self.confirmed else "estimate only"),
            ]
        )
        grid = Grid(("option", "fixes", "peak", "", "from"), self._rows())
        return Card(f"What fits: {self.workload}", [head, grid, Lines(self.notes, "note")])


def default_budget(workload: Workload, system: SystemReport | None = None) -> tuple[int, str]:
    """The device's free memory: CUDA ``mem_get_info`` free, else the host's available RAM."""
    if workload.device_type == "cuda":
        info = cuda.mem_get_info()
        if info is not None:
            return int(info[0]), "free on the GPU (torch.cuda.mem_get_info)"
    host = fix_system.host(system)
    value = host.memory_available_bytes.get() if host is not None else None
    if value:
        return int(value), "host memory available"
    raise GpuDiagError("could not read the free memory here: pass memory_budget= (e.g. '8GiB')")


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _whatif(
    workload: Workload,
    label: str,
    fixes: tuple[str, ...],
    budget: int,
    micro: int,
    stages: Stages | None = None,
    **kwargs: Any,
) -> WhatIf:
    """The estimate with ``fixes`` applied (each says what it changes: FixSpec.memory_args)
    and ``kwargs`` (what is not a fix, such as another optimizer)."""
    if stages is not None:
        stages.next(f"what-if: {label}")
    for fix in fixes:
        kwargs.update(Fix.parse(fix).memory_args())
    micro = int(kwargs.pop("batch_size", micro))
    try:
        est = estimate_memory(
            workload, batch_size=micro, scale_by_batch=False, progress=False, **kwargs
        )
    except GpuDiagError as exc:
        return WhatIf(label, fixes, None, None, f"not available: {str(exc).split(';')[0]}")
    return WhatIf(
        label,
        fixes,
        est.peak_bytes,
        est.peak_bytes <= budget,
        "traced estimate",
        dict(est.breakdown),
    )


def fit(
    workload: Workload,
    memory_budget: Any = None,
    *,
    confirm: bool = True,
    fsdp_degrees: tuple[int, ...] = (2, 4, 8),
    system: SystemReport | None = None,
    progress: bool | ProgressFn = True,
) -> FitResult:
    """The largest micro-batch of ``workload`` that fits ``memory_budget`` (bytes or "8GiB";
    default: the device's free memory), the accumulation that keeps its batch, and a what-if
    table of memory fixes. ``confirm`` runs one measured step at the answer (on a copy).
    ``progress``: a bar naming each estimate and measured step as it runs (``True``), none
    (``False``), or a callback."""
    if not isinstance(workload, Workload) or not workload.owns_step:
        raise WorkloadError("gd.fit needs a gd.Workload with model= and batch=")
    if workload.dataloader is not None and workload.batch is None:
        raise WorkloadError("gd.fit builds batches of other sizes: give the workload batch=")
    if memory_budget is None:
        budget, source = default_budget(workload, system)
    else:
        budget, source = int(parse_budget(memory_budget) or 0), "given"
    global_batch = workload.batch_size
    # The estimate, up to three measured steps and the what-ifs (each a traced step).
    stages = Stages(resolve(progress, "fit"), "step", 7)
    with (
        user_code_failures("gd.fit"),
        shared_limits(workload),
        closed_on_error(stages.on_progress),
    ):
        result = _fit(workload, budget, source, global_batch, confirm, fsdp_degrees, stages)
    stages.finish()
    return result


def _fit(
    workload: Workload,
    budget: int,
    source: str,
    global_batch: int,
    confirm: bool,
    fsdp_degrees: tuple[int, ...],
    stages: Stages,
) -> FitResult:
    notes: list[str] = []
    stages.next("the estimate at the workload's batch")
    est = estimate_memory(workload, progress=False)
    largest = est.largest_batch(budget) if est.per_sample_bytes is not None else None
    scalable = largest
    if largest is None:
        largest = global_batch if est.peak_bytes <= budget else 0
        notes.append("the workload's batch is fixed: no per-sample scaling")
    candidates = [d for d in _divisors(global_batch) if d <= largest]
    micro: int | None = candidates[0] if candidates else None
    confirmed, measured = False, None
    if confirm and micro is not None:
        for size in candidates[:3]:
            stages.next(f"a measured step at micro-batch {size}")
            peak, oom = capped_peak(workload, budget, batch_size=size)
            if oom is None:
                micro, confirmed, measured = size, True, peak
                break
            notes.append(
                f"micro-batch {size} ran out of memory in the measured step "
                f"({oom.explain()[0]}); trying a smaller one"
            )
        else:
            notes.append("no micro-batch was confirmed by a measured step")
            micro = None
    accumulation = None if micro is None else global_batch // micro
    whatifs = [
        WhatIf(
            f"as is (batch {global_batch})",
            (),
            est.peak_bytes,
            est.peak_bytes <= budget,
            "traced estimate",
            dict(est.breakdown),
        )
    ]
    if micro is not None and accumulation and accumulation > 1:
        whatifs.append(
            _whatif(
                workload,
                f"micro-batch {micro} x {accumulation}",
                (f"batch.size:micro_batch={micro},accumulation={accumulation}",),
                budget,
                global_batch,
                stages,
            )
        )
    whatifs.append(
        _whatif(workload, "bf16 autocast", ("precision.bf16",), budget, global_batch, stages)
    )
    whatifs.append(
        _whatif(
            workload,
            "activation checkpointing",
            ("activation.checkpointing",),
            budget,
            global_batch,
            stages,
        )
    )
    whatifs.append(
        _whatif(
            workload,
            "bf16 + checkpointing",
            ("precision.bf16", "activation.checkpointing"),
            budget,
            global_batch,
            stages,
        )
    )
    for n in fsdp_degrees:
        sharded = with_parallelism(est, f"fsdp:{n}")
        whatifs.append(
            WhatIf(
                f"FSDP over {n} GPUs",
                ("fsdp.wrap",),
                sharded.peak_bytes,
                sharded.peak_bytes <= budget,
                "estimate + parallelism (per GPU)",
                dict(sharded.breakdown),
            )
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        whatifs.append(
            WhatIf(
                "8-bit optimizer",
                (),
                None,
                None,
                "not available: bitsandbytes is not installed (pip install bitsandbytes)",
            )
        )
    else:
        whatifs.append(
            _whatif(
                workload, "8-bit optimizer", (), budget, global_batch, stages, optimizer="adam8bit"
            )
        )
    whatifs.append(
        WhatIf(
            "expandable segments",
            ("allocator.config:expandable_segments=true",),
            est.peak_bytes if workload.device_type == "cuda" else None,
            (est.peak_bytes <= budget) if workload.device_type == "cuda" else None,
            "same allocated peak; lowers reserved-but-unused (fragmentation) on a GPU"
            if workload.device_type == "cuda"
            else "not available: a CUDA caching-allocator setting (no effect on a CPU)",
        )
    )
    return FitResult(
        workload=workload.name,
        budget_bytes=budget,
        budget_source=source,
        global_batch=global_batch,
        micro_batch=micro,
        accumulation=accumulation,
        confirmed=confirmed,
        measured_peak_bytes=measured,
        estimate=est,
        whatifs=tuple(whatifs),
        notes=tuple(notes),
        largest_batch=scalable,
    )
