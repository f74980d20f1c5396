"""``gd.memory``: one step's measured peak and timeline by category, beside the estimate.

The step runs as a trial (gpudiag.experiment.trial): on a deep copy of the model with a fresh
optimizer when one fits, and the user's parameters, optimizer state, RNG and torch switches are
restored and verified afterwards, whatever happens inside (an out-of-memory included). One
warm-up step creates the optimizer state; the second step is measured, as in training.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._deadline import user_code_failures
from gpudiag._progress import ProgressFn, Stages, closed_on_error, resolve
from gpudiag._report import jsonable
from gpudiag._values import finite_number, whole_number
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.analysis.memory_estimate import CATEGORIES, MemoryEstimate
from gpudiag.experiment.runner import Arm
from gpudiag.experiment.step_limit import shared_limits
from gpudiag.experiment.trial import isolated
from gpudiag.fixes import Fix
from gpudiag.probe import cuda
from gpudiag.probe.cuda_memory import allocator_stats
from gpudiag.profiling.memory import MemoryTimeline, measure_step_timeline
from gpudiag.profiling.memory_budget import MemoryBudget, MemoryBudgetExceeded, OutOfMemory
from gpudiag.step import Workload, WorkloadError
from gpudiag.units import SI_SUFFIXES, format_bytes, parse_bytes

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport


def measure_timeline(
    workload: Workload,
    *,
    batch_size: int | None = None,
    fixes: tuple[Fix, ...] = (),
    budget_bytes: int | None = None,
    stages: Stages | None = None,
) -> MemoryTimeline:
    """The categorised memory timeline of one steady-state step of ``workload`` (real run).

    Runs on a deep copy of the model (the user's model is never stepped) inside an isolated
    trial, so RNG and global switches are restored too. With ``budget_bytes`` a step first
    runs under a MemoryBudget and raises MemoryBudgetExceeded when it passes it; when it
    fits, the next step is profiled for the timeline. (The budget's per-operator check and
    the profiler's stacks together made one step of notebook 03's micro-batched GPT take
    50-176 s instead of 6 + 2 s apart.) ``stages`` hears of each step as it starts.
    """
    if not workload.owns_step:
        raise WorkloadError(
            "gd.memory needs a gd.Workload with model= and batch= (a step function's own "
            "tensors cannot be told apart); gd.compare measures a step function's peak"
        )
    with _warm_copy(workload, batch_size, fixes, stages) as (arm, track):
        if budget_bytes is not None:
            if stages is not None:
                stages.next(f"a step under the {format_bytes(budget_bytes)} budget")
            with MemoryBudget(budget_bytes, track=track):
                arm.step()
        if stages is not None:
            stages.next("a profiled step (memory timeline)")
        return measure_step_timeline(arm.step, device=str(workload.device), track=track)


def capped_peak(
    workload: Workload,
    budget_bytes: int,
    *,
    batch_size: int | None = None,
    fixes: tuple[Fix, ...] = (),
) -> tuple[int, OutOfMemory | None]:
    """One steady-state step on a copy under a MemoryBudget, without the profiler: the peak
    of live bytes it saw, or the out-of-memory. The user's state is restored either way."""
    with _warm_copy(workload, batch_size, fixes) as (arm, track):
        budget = MemoryBudget(budget_bytes, track=track)
        try:
            with budget:
                arm.step()
        except MemoryBudgetExceeded as exc:
            return budget.peak_bytes, exc.oom
        return budget.peak_bytes, None


@contextlib.contextmanager
def _warm_copy(
    workload: Workload,
    batch_size: int | None,
    fixes: tuple[Fix, ...],
    stages: Stages | None = None,
) -> Iterator[tuple[Arm, list[Any]]]:
    """A trial arm on a deep copy of the model, inside an isolated trial, one step already run
    (the optimizer state exists); with the tensors a memory budget tracks (model, optimizer,
    the next step's batch). The user's state is restored when it closes."""
    if stages is not None:
        stages.next("a copy of the model and a warm-up step")
    with isolated(*workload.protected):
        model = copy.deepcopy(workload.model)
        wl = copy.copy(workload)
        wl.model, wl.protected = model, (model,)
        if batch_size is not None:
            wl.batch_size = whole_number(
                batch_size, "batch_size", low=1, high=1 << 30, error=WorkloadError
            )
        arm = Arm("memory", fixes, wl, model, False, workload.device_type)
        arm.open()
        try:
            arm.new_optimizer()
            with arm.active():
                arm.step()
                batch = arm.target.next_micro_batches()
                track = [model, arm.target.optimizer, *_tensors(batch)]
                yield arm, [t for t in track if t is not None]
        finally:
            arm.close()


def other_processes(
    system: SystemReport | None, cuda_index: int | None = None, own_pid: int | None = None
) -> tuple[dict[str, Any], ...]:
    """Processes other than this one on the GPU (NVML, or a recording): pid, name, bytes
    (None when the driver does not say). ``cuda_index`` None: every GPU of the report."""
    own = os.getpid() if own_pid is None else own_pid
    out = []
    for gpu in system.gpus if system is not None else ():
        if cuda_index is not None and gpu.info.cuda_index != cuda_index:
            continue
        for proc in gpu.state.processes.get(None) or ():
            if proc.pid != own:
                used = proc.used_memory_bytes.get(None)
                out.append(
                    {
                        "gpu": gpu.info.index,
                        "pid": proc.pid,
                        "name": proc.name,
                        "used_bytes": None if used is None else int(used),
                    }
                )
    return tuple(out)


def _tensors(batch: Any) -> list[Any]:
    import torch

    return [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]


# A budget above an exbibyte is not a memory size of any machine.
MAX_BUDGET_BYTES = 1 << 60


def parse_budget(budget: Any) -> int | None:
    """Bytes from an int or a string such as "512MiB", "1.5 GiB", "2GB"; None stays None.
    ASCII digits only, finite, positive, at most an exbibyte; else WorkloadError."""
    if budget is None:
        return None
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        value = finite_number(
            budget, "a memory budget (bytes)", low=0, high=MAX_BUDGET_BYTES, low_open=True,
            error=WorkloadError,
        )  # fmt: skip
    elif isinstance(budget, str):
        parsed = parse_bytes(budget, SI_SUFFIXES)
        if parsed is None:
            raise WorkloadError(
                f"memory budget {budget[:40]!r}: write bytes or e.g. '512MiB', '2GB' "
                "(ASCII digits and a unit)"
            )
        value = parsed
        if value > MAX_BUDGET_BYTES:
            raise WorkloadError(f"memory budget {budget!r} is more than an exbibyte")
    else:
        raise WorkloadError(f"memory budget must be bytes or a string, got {budget!r}")
    if int(value) < 1:
        raise WorkloadError("a memory budget must be positive")
    return int(value)


def cuda_oom(exc: BaseException, budget_bytes: int | None) -> OutOfMemory:
    """An OutOfMemory from torch's CUDA error text ("Tried to allocate 2.00 GiB ... of which
    1.23 GiB is free") and the allocator's counters. Untested on a real GPU."""
    text = str(exc)

    def amount(pattern: str) -> int | None:
        m = re.search(pattern + r"\s*([0-9.]+)\s*(GiB|MiB|KiB|bytes|B)", text)
        if not m:
            return None
        scale = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}.get(m.group(2), 1)
        return int(float(m.group(1)) * scale)

    asked = amount(r"Tried to allocate") or 0
    free = amount(r"of which") or 0
    stats = allocator_stats()
    live = dict.fromkeys(CATEGORIES, 0)
    notes = []
    if stats is not None:
        live["other"] = stats.allocated_bytes
        if stats.reserved_unused_bytes > 0.2 * max(stats.reserved_bytes, 1):
            notes.append(
                f"{format_bytes(stats.reserved_unused_bytes)} reserved but unused: try "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fix allocator.config)"
            )
    return OutOfMemory(
        asked_bytes=asked,
        free_bytes=free,
        budget_bytes=budget_bytes or (stats.reserved_bytes + free if stats else free),
        operator="CUDA allocation",
        live_bytes=live,
        start_bytes=dict.fromkeys(CATEGORIES, 0),
        source="torch.cuda.OutOfMemoryError and torch.cuda.memory_stats",
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class MemoryReport(Carded):
    """Measured memory of one training step, by category, with the estimate beside it."""

    workload: str
    timeline: MemoryTimeline
    estimate: MemoryEstimate | None = None
    batch_size: int | None = None
    fixes: tuple[str, ...] = ()
    allocator: dict[str, Any] = field(default_factory=dict)  # GPU: torch.cuda.memory_stats
    notes: tuple[str, ...] = ()
    oom: OutOfMemory | None = None
    budget_bytes: int | None = None
    other_processes: tuple[dict[str, Any], ...] = ()  # GPU: NVML, processes other than this

    @property
    def peak_bytes(self) -> int:
        """The step's peak; after an out-of-memory, the bytes live when it failed."""
        if self.oom is not None:
            return sum(self.oom.live_bytes.values())
        return self.timeline.peak_bytes

    @property
    def at_peak(self) -> dict[str, int]:
        if self.oom is not None:
            return dict(self.oom.live_bytes)
        return self.timeline.at_peak

    def difference(self) -> dict[str, int]:
        """Measured minus estimated bytes per category at the peak (empty without estimate)."""
        if self.estimate is None:
            return {}
        return {
            c: self.at_peak.get(c, 0) - int(self.estimate.breakdown.get(c, 0)) for c in CATEGORIES
        }

    def explain_difference(self) -> list[str]:
        """Sentences that say where the estimate and the measurement part ways, and why."""
        if self.estimate is None or not self.timeline.rows:
            return []
        est, meas = self.estimate.peak_bytes, self.peak_bytes
        rel = (meas - est) / meas if meas else 0.0
        out = [
            f"measured {format_bytes(meas)} vs estimated {format_bytes(est)} "
            f"({rel:+.0%} of the measurement)"
        ]
        diff = self.difference()
        # The profiler files autograd's own buffers and backward temporaries where the tracer
        # files them as activations or temporaries: compare those two together.
        moved = diff.get("activations", 0) + diff.get("temporaries", 0)
        big = sorted(
            ((c, d) for c, d in diff.items() if c not in ("activations", "temporaries")),
            key=lambda cd: -abs(cd[1]),
        )
        if abs(moved) > 0.05 * max(meas, 1):
            out.append(
                f"activations + temporaries differ by {format_bytes(moved)}: "
                + (
                    "kernels allocate scratch the tracer does not see (oneDNN on a CPU, cuDNN "
                    "workspaces on a GPU)"
                    if moved > 0
                    else "the tracer keeps tensors the real step frees sooner"
                )
            )
        for cat, d in big[:2]:
            if abs(d) > 0.05 * max(meas, 1):
                out.append(f"{cat} differ by {format_bytes(d)}")
        if len(out) == 1:
            out.append("every category within 5 % of the peak")
        return out

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "memory_report",
                "workload": self.workload,
                "batch_size": self.batch_size,
                "fixes": list(self.fixes),
                "peak_bytes": self.peak_bytes,
                "at_peak": self.at_peak,
                "estimate": self.estimate,
                "difference": self.difference(),
                "explanation": self.explain_difference(),
                "allocator": self.allocator,
                "timeline": self.timeline,
                "notes": list(self.notes),
                "oom": self.oom,
                "budget_bytes": self.budget_bytes,
                "other_processes": list(self.other_processes),
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def _rows(self) -> list[tuple[str, str, str]]:
        est = self.estimate.breakdown if self.estimate else {}
        return [
            (c, format_bytes(self.at_peak.get(c, 0)), format_bytes(est.get(c)) if est else "")
            for c in CATEGORIES
            if self.at_peak.get(c, 0) or est.get(c, 0)
        ]

    def __repr__(self) -> str:
        what = "live at the out-of-memory" if self.oom else "measured peak"
        lines = [
            f"MemoryReport({self.workload}: {what} {format_bytes(self.peak_bytes)} "
            f"on {self.timeline.device}"
            + (f", estimate {format_bytes(self.estimate.peak_bytes)})" if self.estimate else ")")
        ]
        if self.oom is not None:
            lines += [f"  {line}" for line in self.oom.explain()]
        lines += [f"  {c:<16} {m:>12}  {e:>12}" for c, m, e in self._rows()]
        lines += [f"  {s}" for s in self.explain_difference()]
        for p in self.other_processes:
            used = format_bytes(p["used_bytes"]) if p["used_bytes"] is not None else "N/A"
            lines.append(f"  other process on GPU {p['gpu']}: pid {p['pid']} {p['name']} ({used})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        head = Facts(
            [
                (
                    "measured peak",
                    "out of memory" if self.oom else format_bytes(self.peak_bytes),
                ),
                (
                    "estimate",
                    format_bytes(self.estimate.peak_bytes) if self.estimate else "not estimated",
                ),
                ("source", self.timeline.source),
            ]
        )
        grid = Grid(("category at peak", "measured", "estimated"), self._rows())
        oom = Lines(self.oom.explain() if self.oom else [], "error")
        notes = Lines([*self.explain_difference(), *self.notes], "note")
        return Card(f"Memory: {self.workload}", [head, grid, oom, notes])


def memory(
    workload: Workload,
    *,
    batch_size: int | None = None,
    fixes: Any = (),
    estimate: bool = True,
    budget: Any = None,
    system: SystemReport | None = None,
    progress: bool | ProgressFn = True,
) -> MemoryReport:
    """Measure one training step's memory by category (real run on a copy), beside the
    traced estimate. ``fixes``: fix ids or ``gd.Fix`` objects to measure with (bf16,
    checkpointing, batch.size). ``budget`` (bytes or "512MiB"): a memory cap for the step;
    past it the step stops with an out-of-memory that the report explains (on a GPU a real
    CUDA out-of-memory is explained the same way). Either way the user's state is restored.
    On a GPU the allocator's counters (``torch.cuda.memory_stats``) and the other processes on
    the device (NVML, through ``system`` or a fresh ``gd.inspect()``) are added.
    ``progress``: a bar naming each step as it runs (``True``), none (``False``), or a
    callback that gets a ``gpudiag._progress.Progress`` per step and ``finished`` at the end.
    """
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"gd.memory takes a gd.Workload, got {type(workload).__name__}; for a config use "
            "gd.estimate_memory"
        )
    with user_code_failures("gd.memory"), shared_limits(workload):
        return _memory(workload, batch_size, fixes, estimate, budget, system, progress)


def _memory(
    workload: Workload,
    batch_size: int | None,
    fixes: Any,
    estimate: bool,
    budget: Any,
    system: SystemReport | None,
    progress: bool | ProgressFn,
) -> MemoryReport:
    from gpudiag.experiment.estimate import estimate_memory

    chosen = tuple(Fix.coerce(f) for f in ((fixes,) if isinstance(fixes, (str, Fix)) else fixes))
    notes: list[str] = []
    budget_bytes = parse_budget(budget)
    oom: OutOfMemory | None = None
    timeline = MemoryTimeline((), (), device=str(workload.device), source="not measured")
    stages = Stages(resolve(progress, "memory"), "step", 3 + (budget_bytes is not None))
    # An out-of-memory is a result the report explains; any other error leaves the bar
    # where it stopped.
    with closed_on_error(stages.on_progress):
        try:
            timeline = measure_timeline(
                workload,
                batch_size=batch_size,
                fixes=chosen,
                budget_bytes=budget_bytes,
                stages=stages,
            )
        except MemoryBudgetExceeded as exc:
            oom = exc.oom
        except Exception as exc:
            if not cuda.is_oom_error(exc):
                raise
            oom = cuda_oom(exc, budget_bytes)
    allocator: dict[str, Any] = {}
    others: tuple[dict[str, Any], ...] = ()
    stats = allocator_stats()
    if stats is not None:
        allocator = jsonable(stats)
    if workload.device_type == "cuda":
        if system is None:
            from gpudiag.probe.system import inspect

            system = inspect()
        others = other_processes(system, workload.device.index or 0)
    elif workload.device_type == "cpu":
        notes.append("CPU: no caching allocator counters (torch.cuda.memory_stats is CUDA only)")
    est = None
    if estimate:
        # Each fix says what it changes in the estimate (FixSpec.memory_args).
        args: dict[str, Any] = {}
        for fix in chosen:
            args.update(fix.memory_args())
        stages.next("the estimate (traced on fake tensors)")
        try:
            with closed_on_error(stages.on_progress):
                est = estimate_memory(
                    workload,
                    batch_size=args.pop("batch_size", None) or batch_size,
                    progress=False,
                    **args,
                )
        except Exception as exc:  # the estimate is a comparison; the measurement stands alone
            notes.append(f"no estimate: {exc}")
    stages.finish()
    return MemoryReport(
        workload=workload.name,
        timeline=timeline,
        estimate=est,
        batch_size=batch_size or workload.batch_size,
        fixes=tuple(f.label for f in chosen),
        allocator=allocator,
        notes=tuple(notes),
        oom=oom,
        budget_bytes=budget_bytes,
        other_processes=others,
    )
