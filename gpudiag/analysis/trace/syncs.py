"""Host-device synchronisation points and the Python lines that caused them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.trace.model import (
    ASYNC_COPY_RUNTIME_NAMES,
    SYNC_OP_NAMES,
    SYNC_RUNTIME_NAMES,
    Events,
    Kind,
    fields_json,
)
from gpudiag.analysis.trace.nesting import Nesting
from gpudiag.analysis.trace.window import Step, step_of

# Frames that belong to torch, the standard library or the interpreter, not the user.
_INTERNAL_FRAME = re.compile(
    r"(?:^|[/\\])(?:site-packages|dist-packages)[/\\]|^torch[/\\]|[/\\]torch[/\\]|"
    r"^<built-in|^<frozen|^<string>|^threading\.py|[/\\]threading\.py|^contextlib\.py|"
    r"[/\\]contextlib\.py|^typing\.py|[/\\]IPython[/\\]|^IPython[/\\]|[/\\]gpudiag[/\\]|"
    r"^gpudiag[/\\]|[/\\]lib[/\\]python3\.\d+[/\\]"
)
# gpudiag's own step driver (gd.diagnose, gd.compare): a sync reached through it before any
# user frame was made by torch itself (an optimizer's ``.item()``), not by the user's code.
_DRIVER_FRAME = re.compile(r"[/\\]gpudiag[/\\]|^gpudiag[/\\]")
_MAX_RESOLVED = 5000  # call sites looked up per trace; more sync events are only counted


def is_user_frame(frame: str) -> bool:
    return _INTERNAL_FRAME.search(frame.strip()) is None


def _first_user_frame(frames: list[str]) -> str | None:
    """The innermost user frame, or None when gpudiag's own frames come first."""
    for frame in frames:
        if _DRIVER_FRAME.search(frame.strip()):
            return None
        if frame and is_user_frame(frame):
            return frame.strip()
    return None


@dataclass(frozen=True)
class SyncEvent:
    """One point where the host waited for the GPU (or may have: ``.item()`` copies)."""

    name: str  # cudaStreamSynchronize, cudaMemcpyAsync, aten::_local_scalar_dense, ...
    kind: str  # "runtime" (a CUDA/HIP call) or "op" (an operator that copies to the host)
    start_us: float
    duration_us: float
    step: int | None  # ProfilerStep number
    inside_op: str | None  # the operator the call happened in (aten::item, aten::to, ...)
    call_site: str | None  # "train.py(42): step", from the stack when recorded
    # The GPU's idle gap around the moment the wait ended (every stream idle): the queue
    # drained while the host waited and refills only once it launches again. None on a
    # CPU-only trace, or when the GPU was still busy (a wait on another stream).
    gpu_gap_start_us: float | None = None
    gpu_gap_end_us: float | None = None
    # The torch.optim optimizer whose ``step`` made the call ("AdamW"), from the
    # ``Optimizer.step#AdamW.step`` range torch records around every step; None outside one.
    optimizer: str | None = None
    # A copy call that blocked because one side is pageable host memory: the memcpy it
    # launched ("Memcpy DtoH (Device -> Pageable)"), its bytes and its own time on the GPU.
    copy: str | None = None
    copy_bytes: int | None = None
    copy_gpu_us: float | None = None
    # GPU time (all streams, merged) that ran during the wait: earlier work the host waited
    # for. The rest of the wait the GPU sat idle. None on a CPU-only trace.
    gpu_busy_us: float | None = None
    # Made inside compilation, graph capture or another warm-up (host_activity.WARMUP): not
    # the steady state's, and often not the user's code (torch's graph recording).
    during_warmup: bool = False

    @property
    def gpu_gap_us(self) -> float:
        if self.gpu_gap_start_us is None or self.gpu_gap_end_us is None:
            return 0.0
        return self.gpu_gap_end_us - self.gpu_gap_start_us

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class SyncSite:
    """Sync events grouped by where they came from."""

    call_site: str | None
    name: str
    count: int
    total_us: float

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


def _from_call_stack(stack: str) -> str | None:
    # Kineto writes "Call stack" innermost frame first, frames separated by ";".
    return _first_user_frame(stack.split(";"))


class _PythonFrames:
    """Python frames (with_stack) of each thread, for the innermost user frame at a time."""

    def __init__(self, events: Events) -> None:
        rows = np.flatnonzero(events.kind == Kind.PYTHON)
        self.events = events
        self.by_thread: dict[int, Any] = {}
        if rows.size:
            threads = events.thread[rows]
            for t in np.unique(threads).tolist():
                r = rows[threads == t]
                self.by_thread[t] = (r, events.ts[r], events.ts[r] + events.dur[r])

    def user_frame_at(self, thread: int, start: float, end: float) -> str | None:
        entry = self.by_thread.get(thread)
        if entry is None:
            return None
        rows, ts, ends = entry
        enclosing = np.flatnonzero((ts <= start) & (ends >= end))
        names = self.events.names
        # Innermost first: the frame that started last.
        order = enclosing[np.argsort(-ts[enclosing], kind="stable")].tolist()
        return _first_user_frame([names[int(self.events.name[rows[i]])] for i in order])


_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#([A-Za-z_][\w.]*)\.step$")


class _OptimizerSteps:
    """The ``Optimizer.step#<Name>.step`` ranges torch.optim records, per thread."""

    def __init__(self, events: Events) -> None:
        names = {
            i: m.group(1) for i, n in enumerate(events.names) if (m := _OPTIMIZER_STEP.match(n))
        }
        self.events = events
        self.names = names
        self.by_thread: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if not names:
            return
        ids = np.fromiter(names, dtype=np.int64, count=len(names))
        rows = np.flatnonzero((events.kind == Kind.ANNOTATION) & events.name_in(ids))
        for t in np.unique(events.thread[rows]).tolist():
            r = rows[events.thread[rows] == t]
            r = r[np.argsort(events.ts[r], kind="stable")]
            self.by_thread[t] = (r, events.ts[r], events.ts[r] + events.dur[r])

    def around(self, thread: int, start: float, end: float) -> str | None:
        entry = self.by_thread.get(thread)
        if entry is None:
            return None
        rows, starts, ends = entry
        i = int(np.searchsorted(starts, start, side="right")) - 1
        if i < 0 or ends[i] < end:
            return None
        return self.names.get(int(self.events.name[rows[i]]))


def _gap_at(
    busy: tuple[np.ndarray, np.ndarray] | None, start: float, end: float
) -> tuple[float, float] | None:
    """The GPU idle time a wait ``[start, end)`` left: from when the GPU ran dry (not before
    the wait began: idle time before it is not the wait's doing) to the next GPU work."""
    if busy is None or busy[0].size == 0:
        return None
    starts, ends = busy
    i = int(np.searchsorted(starts, end, side="right")) - 1
    if i >= 0 and ends[i] > end:
        return None  # the GPU was still running something
    if i + 1 >= starts.size or i < 0:
        return None  # before the first or after the last GPU work: no gap to bound
    return max(float(ends[i]), start), float(starts[i + 1])


def busy_within(busy: tuple[np.ndarray, np.ndarray] | None, start: float, end: float) -> float:
    """GPU busy time inside ``[start, end)``, from merged (sorted, disjoint) busy intervals."""
    if busy is None or busy[0].size == 0 or end <= start:
        return 0.0
    starts, ends = busy
    lo = int(np.searchsorted(ends, start, side="right"))
    hi = int(np.searchsorted(starts, end, side="left"))
    if hi <= lo:
        return 0.0
    s = np.clip(starts[lo:hi], start, end)
    e = np.clip(ends[lo:hi], start, end)
    return float(np.sum(e - s))


def pageable_copy_calls(
    events: Events, gpu_rows: np.ndarray, launch_rows: np.ndarray
) -> dict[int, int]:
    """Asynchronous copy calls whose memcpy has a pageable host side: runtime row -> memcpy
    row. ``launch_rows[i]`` is the runtime row that launched ``gpu_rows[i]`` (-1: none)."""
    copy_ids = {i for i, n in enumerate(events.names) if n in ASYNC_COPY_RUNTIME_NAMES}
    if not copy_ids:
        return {}
    pageable_ids = {
        i for i, n in enumerate(events.names) if "Pageable" in n and n.startswith("Memcpy")
    }
    launched = launch_rows >= 0
    g, r = gpu_rows[launched], launch_rows[launched]
    blocking = (
        (events.kind[g] == Kind.MEMCPY)
        & np.isin(events.name[g], np.fromiter(pageable_ids, np.int64, len(pageable_ids)))
        & np.isin(events.name[r], np.fromiter(copy_ids, np.int64, len(copy_ids)))
    )
    # In row order, a later memcpy of the same call wins (as a dict filled in that order).
    return dict(zip(r[blocking].tolist(), g[blocking].tolist(), strict=True))


def find_syncs(
    events: Events,
    nesting: Nesting,
    steps: tuple[Step, ...],
    host_mask: np.ndarray,
    gpu_busy: tuple[np.ndarray, np.ndarray] | None = None,
    blocking_copies: Mapping[int, int] | None = None,
) -> tuple[SyncEvent, ...]:
    """Sync calls, blocking copy calls and host-copy operators in the window, in time order.
    ``gpu_busy``: the merged busy intervals of the GPU (all streams), to find the idle gap
    each wait left. ``blocking_copies``: copy calls that blocked on pageable memory (runtime
    row -> the memcpy it launched, see ``pageable_copy_calls``)."""
    copies = dict(blocking_copies or {})
    sync_name_ids = np.array(
        [i for i, n in enumerate(events.names) if n in SYNC_RUNTIME_NAMES or n in SYNC_OP_NAMES],
        dtype=np.int32,
    )
    if sync_name_ids.size == 0 and not copies:
        return ()
    kinds_ok = events.kind_in((Kind.RUNTIME, Kind.CPU_OP))
    wanted = events.name_in(sync_name_ids)
    if copies:
        wanted[np.fromiter(copies, dtype=np.int64, count=len(copies))] = True
    rows = np.flatnonzero(host_mask & kinds_ok & wanted)
    rows = rows[np.argsort(events.ts[rows], kind="stable")]
    frames = _PythonFrames(events)
    optimizer_steps = _OptimizerSteps(events)
    step_idx = step_of(steps, events.ts[rows])
    out: list[SyncEvent] = []
    for i, row in enumerate(rows.tolist()):
        name = events.names[events.name[row]]
        parent = int(nesting.parent_op[row])
        inside = events.names[events.name[parent]] if parent >= 0 else None
        site = None
        if i < _MAX_RESOLVED:
            stack, up, depth = None, row, 0
            while up >= 0 and depth < 8:  # the nearest enclosing op that kept its stack
                stack = events.stacks.get(up)
                if stack is not None:
                    break
                up, depth = int(nesting.parent_op[up]), depth + 1
            if stack is not None:
                site = _from_call_stack(stack)
            if site is None:
                start = float(events.ts[row])
                site = frames.user_frame_at(
                    int(events.thread[row]), start, start + float(events.dur[row])
                )
        s = int(step_idx[i])
        start, end = float(events.ts[row]), float(events.ts[row] + events.dur[row])
        gap = _gap_at(gpu_busy, start, end)
        copy = copies.get(row)
        nbytes = (
            int(events.launches.nbytes[events.extra[copy]])
            if copy is not None and events.extra[copy] >= 0
            else -1
        )
        out.append(
            SyncEvent(
                name=name,
                kind="runtime" if events.kind[row] == Kind.RUNTIME else "op",
                start_us=float(events.ts[row]),
                duration_us=float(events.dur[row]),
                step=steps[s].number if s >= 0 else None,
                inside_op=inside,
                call_site=site,
                gpu_gap_start_us=gap[0] if gap else None,
                gpu_gap_end_us=gap[1] if gap else None,
                optimizer=optimizer_steps.around(
                    int(events.thread[row]),
                    float(events.ts[row]),
                    float(events.ts[row] + events.dur[row]),
                ),
                copy=events.names[events.name[copy]] if copy is not None else None,
                copy_bytes=nbytes if nbytes >= 0 else None,
                copy_gpu_us=float(events.dur[copy]) if copy is not None else None,
                gpu_busy_us=busy_within(gpu_busy, start, end) if gpu_busy is not None else None,
            )
        )
    return tuple(out)


def sync_sites(syncs: tuple[SyncEvent, ...]) -> tuple[SyncSite, ...]:
    groups: dict[tuple[str | None, str], list[float]] = {}
    for s in syncs:
        g = groups.setdefault((s.call_site, s.name), [0, 0.0])
        g[0] += 1
        g[1] += s.duration_us
    sites = [SyncSite(site, name, int(c), float(t)) for (site, name), (c, t) in groups.items()]
    sites.sort(key=lambda s: -s.total_us)
    return tuple(sites)
