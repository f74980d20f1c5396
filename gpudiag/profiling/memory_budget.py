"""A memory cap for a step on any device: out-of-memory at a budget you set, with the culprits.

``MemoryBudget(budget_bytes, track=...)`` runs a block under torch's memory tracker
(``torch.distributed._tools.mem_tracker.MemTracker``, real tensors) and checks the live bytes
after every operator. When they pass the budget it raises ``MemoryBudgetExceeded`` (a
``MemoryError``, so ``gpudiag.probe.cuda.is_oom_error`` treats it as an out-of-memory) after
recording what the operator asked for, what was left, the live bytes by category against
those at the start, and the allocations still alive with the Python line that made them. On a
CPU this is how gpudiag makes an out-of-memory happen on purpose (a real CPU rarely runs out);
on a GPU it gives a budget below the device's size (e.g. what another process leaves). The
check runs after each operator, so the operator that crosses the budget has already allocated.
"""

from __future__ import annotations

import traceback
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import jsonable
from gpudiag.analysis.memory_estimate import CATEGORIES
from gpudiag.errors import GpuDiagError
from gpudiag.profiling.memory import (
    TRACKER_CATEGORIES,
    MemoryMeasurementError,
    repeated_roots_allowed,
)
from gpudiag.units import format_bytes


@dataclass(frozen=True)
class LiveAllocation:
    """Live bytes made at one line of the user's code (or torch's, when no user frame)."""

    site: str
    nbytes: int
    count: int


@dataclass(frozen=True)
class OutOfMemory:
    """What an out-of-memory looked like: asked vs free, which category grew, who holds it."""

    asked_bytes: int
    free_bytes: int  # budget (or device free memory) minus what was live before the request
    budget_bytes: int
    operator: str
    live_bytes: dict[str, int]  # by category when it failed
    start_bytes: dict[str, int]  # by category when the step began
    live_allocations: tuple[LiveAllocation, ...] = ()
    source: str = "gpudiag memory budget (checked after each operator)"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def grown(self) -> dict[str, int]:
        """Bytes each category gained during the step, largest first."""
        diff = {c: self.live_bytes.get(c, 0) - self.start_bytes.get(c, 0) for c in CATEGORIES}
        return dict(sorted(((c, d) for c, d in diff.items() if d > 0), key=lambda cd: -cd[1]))

    @property
    def overflowing_category(self) -> str | None:
        """The category whose growth in the step took the memory past the budget."""
        grown = self.grown
        return next(iter(grown), None)

    def explain(self) -> list[str]:
        out = [
            f"out of memory in {self.operator}: asked for {format_bytes(self.asked_bytes)} "
            f"with {format_bytes(max(self.free_bytes, 0))} free of a "
            f"{format_bytes(self.budget_bytes)} budget"
        ]
        if self.overflowing_category:
            grown = self.grown
            parts = ", ".join(f"{c} +{format_bytes(b)}" for c, b in list(grown.items())[:3])
            out.append(f"{self.overflowing_category} grew past the budget ({parts} in this step)")
        for alloc in self.live_allocations[:3]:
            out.append(f"live: {format_bytes(alloc.nbytes)} from {alloc.site} ({alloc.count}x)")
        return out + list(self.notes)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "asked_bytes": self.asked_bytes,
                "free_bytes": self.free_bytes,
                "budget_bytes": self.budget_bytes,
                "operator": self.operator,
                "live_bytes": self.live_bytes,
                "start_bytes": self.start_bytes,
                "grown": self.grown,
                "overflowing_category": self.overflowing_category,
                "live_allocations": self.live_allocations,
                "source": self.source,
                "explanation": self.explain(),
            }
        )


class MemoryBudgetExceeded(GpuDiagError, MemoryError):
    """A step went past its memory budget; ``.oom`` says how (gd.memory reports it)."""

    def __init__(self, oom: OutOfMemory) -> None:
        super().__init__(oom.explain()[0])
        self.oom = oom


_FRAMEWORK = ("/torch/", "\\torch\\", "/gpudiag/", "\\gpudiag\\", "<frozen", "/lib/python")


def _is_user(filename: str) -> bool:
    # gpudiag's demo workloads are model code like a user's; the rest of gpudiag is machinery.
    if "gpudiag" in filename and "workloads" in filename:
        return True
    return not any(m in filename for m in _FRAMEWORK)


def _user_site() -> str:
    stack = traceback.extract_stack(limit=40)
    for frame in reversed(stack):
        if _is_user(frame.filename):
            return f"{frame.filename}:{frame.lineno} {frame.name}"
    for frame in reversed(stack):  # all framework: the innermost torch frame still helps
        if "/gpudiag/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} {frame.name}"
    return "unknown"


def _by_category(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = str(getattr(key, "value", key))
            if name != "Total":
                out[TRACKER_CATEGORIES.get(name, "other")] += int(value)
    return out


class MemoryBudget:
    """``with MemoryBudget(budget_bytes, track=[model, optimizer, *inputs]): step()``."""

    def __init__(self, budget_bytes: int, *, track: Any = ()) -> None:
        if int(budget_bytes) < 1:
            raise GpuDiagError("a memory budget must be at least 1 byte")
        self.budget_bytes = int(budget_bytes)
        self.track = list(track)
        self.peak_bytes = 0  # the highest live total seen after an operator
        self._stack: list[Any] = []

    def __enter__(self) -> MemoryBudget:
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError as exc:
            raise MemoryMeasurementError(f"torch's MemTracker is not available: {exc}") from None
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = MemTracker()
        tracker.track_external(*self.track)
        budget = self.budget_bytes
        sites: dict[int, tuple[Any, int, str]] = {}  # id(storage) -> (weakref, bytes, site)
        holder: dict[str, Any] = {}
        owner = self

        def total(snapshot: dict[Any, dict[Any, int]]) -> int:
            return sum(int(d.get("Total", 0)) for d in snapshot.values())

        class Check(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch

                before = total(tracker.get_tracker_snapshot("current"))
                out = func(*args, **(kwargs or {}))
                after_snap = tracker.get_tracker_snapshot("current")
                after = total(after_snap)
                owner.peak_bytes = max(owner.peak_bytes, after)
                site = None
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor) and not t.is_meta:
                        st = t.untyped_storage()
                        known = sites.get(id(st))
                        if known is None or known[0]() is not st:
                            site = site or _user_site()
                            sites[id(st)] = (weakref.ref(st), st.nbytes(), site)
                if after > budget:
                    live: dict[str, list[int]] = defaultdict(lambda: [0, 0])
                    for ref, nbytes, where in list(sites.values()):
                        if ref() is not None:
                            live[where][0] += nbytes
                            live[where][1] += 1
                    ranked = sorted(live.items(), key=lambda kv: -kv[1][0])[:10]
                    raise MemoryBudgetExceeded(
                        OutOfMemory(
                            asked_bytes=max(0, after - before),
                            free_bytes=budget - before,
                            budget_bytes=budget,
                            operator=str(func),
                            live_bytes=_by_category(after_snap),
                            start_bytes=holder["start"],
                            live_allocations=tuple(LiveAllocation(s, n, c) for s, (n, c) in ranked),
                        )
                    )
                return out

        allow = repeated_roots_allowed(tracker)
        allow.__enter__()
        self._stack.append(allow)
        tracker.__enter__()
        self._stack.append(tracker)
        holder["start"] = _by_category(tracker.get_tracker_snapshot("current"))
        check = Check()
        check.__enter__()
        self._stack.append(check)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._stack:
            self._stack.pop().__exit__(*exc)
