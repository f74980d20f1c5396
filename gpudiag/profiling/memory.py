"""Memory of one step by category: traced without allocating (fake tensors) or measured (profiler).

Two measurements of the same thing, the live tensor bytes of one training step by category:

* ``traced_step_memory``: runs the step on fake tensors (``torch._subclasses.fake_tensor``:
  shapes, dtypes and devices, no storage) under torch's own memory tracker
  (``torch.distributed._tools.mem_tracker.MemTracker``, which sorts every storage into
  parameter / buffer / gradient / activation / temporary / optimizer state by when it is
  made). Nothing is allocated, so it answers for a model that would not fit. It sees what the
  operators declare; a CPU kernel's private scratch buffers (oneDNN convolution and
  batch-norm backward) are not declared, so the CPU can measure more than it traces.
* ``measure_step_timeline``: runs the step for real under ``torch.profiler`` with memory
  events, shapes and stacks, and reads torch's categorised memory timeline (the data behind
  ``profile.export_memory_timeline``: parameter, optimizer state, input, temporary,
  activation, gradient, autograd detail). On a CPU this is the real peak; on a GPU the same
  timeline covers the CUDA device (untested on a real GPU in this version).

Both are private torch APIs (underscored modules); when one is missing the functions say so
with a MemoryMeasurementError instead of failing obscurely.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import jsonable
from gpudiag.analysis.memory_estimate import CATEGORIES
from gpudiag.errors import MemoryMeasurementError

# torch.profiler._memory_profiler.Category names -> gpudiag categories. Buffers and the step's
# inputs are both "INPUT" to the profiler; autograd's own tensors are temporaries of backward.
PROFILER_CATEGORIES: dict[str, str] = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer_state",
    "INPUT": "inputs",
    "TEMPORARY": "temporaries",
    "ACTIVATION": "activations",
    "GRADIENT": "gradients",
    "AUTOGRAD_DETAIL": "temporaries",
}
# The order of torch's exported timelines (``_CATEGORY_TO_COLORS``): the raw export's 4th field
# and the JSON export's columns 1.. follow it; the last (None) is an unknown role.
EXPORT_ORDER: tuple[str | None, ...] = (
    "PARAMETER",
    "OPTIMIZER_STATE",
    "INPUT",
    "TEMPORARY",
    "ACTIVATION",
    "GRADIENT",
    "AUTOGRAD_DETAIL",
    None,
)
# MemTracker reference types -> gpudiag categories.
TRACKER_CATEGORIES: dict[str, str] = {
    "Parameter": "parameters",
    "Buffer": "inputs",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer_state",
    "Other": "inputs",
}


def _category(name: str | None) -> str:
    return PROFILER_CATEGORIES.get(name or "", "other")


@dataclass(frozen=True)
class MemoryTimeline:
    """Live bytes by category over one step: ``times_us`` and one row per time, by category.

    ``peak_bytes`` is the largest total; ``at_peak`` its breakdown; ``start_bytes`` what was
    live when the step began (parameters, optimizer state, inputs).
    """

    times_us: tuple[float, ...]
    rows: tuple[tuple[int, ...], ...]  # each row: bytes per category, in ``categories`` order
    categories: tuple[str, ...] = CATEGORIES
    device: str = "cpu"
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def totals(self) -> list[int]:
        return [sum(r) for r in self.rows]

    @property
    def peak_index(self) -> int:
        totals = self.totals
        return max(range(len(totals)), key=totals.__getitem__) if totals else 0

    @property
    def peak_bytes(self) -> int:
        return max(self.totals, default=0)

    @property
    def start_bytes(self) -> int:
        return sum(self.rows[0]) if self.rows else 0

    @property
    def at_peak(self) -> dict[str, int]:
        if not self.rows:
            return dict.fromkeys(self.categories, 0)
        return dict(zip(self.categories, self.rows[self.peak_index], strict=True))

    def series(self, category: str) -> list[int]:
        i = self.categories.index(category)
        return [r[i] for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "device": self.device,
                "source": self.source,
                "categories": list(self.categories),
                "times_us": list(self.times_us),
                "rows": [list(r) for r in self.rows],
                "peak_bytes": self.peak_bytes,
                "at_peak": self.at_peak,
                "notes": list(self.notes),
            }
        )


def _rows_from(
    times: Sequence[float], sizes: Sequence[Sequence[int]], columns: Sequence[str | None]
) -> tuple[tuple[float, ...], tuple[tuple[int, ...], ...]]:
    index = {c: i for i, c in enumerate(CATEGORIES)}
    rows = []
    for size in sizes:
        row = [0] * len(CATEGORIES)
        for column, value in zip(columns, size, strict=False):
            row[index[_category(column)]] += int(value)
        rows.append(tuple(row))
    return tuple(float(t) for t in times), tuple(rows)


def timeline_from_raw_events(
    events: Sequence[Sequence[Any]], *, device: str = "cpu", source: str = ""
) -> MemoryTimeline:
    """A timeline (microseconds from the first event) from ``export_memory_timeline_raw``
    events: ``[time_ns, action, bytes, category]`` with action 1 pre-existing (time -1),
    2 create, 3 increment version, 4 destroy (torch's ``Action`` values), bytes already signed
    (a destroy and the old half of a version bump are negative) and category an index into
    torch's export order."""
    parsed: list[tuple[float, int, int, int]] = []
    for event in events:
        try:
            t, action, nbytes, cat = float(event[0]), int(event[1]), int(event[2]), int(event[3])
        except (TypeError, ValueError, IndexError):
            raise MemoryMeasurementError(
                f"not a raw memory timeline event (time, action, bytes, category): {event!r}"
            ) from None
        if not 0 <= cat < len(EXPORT_ORDER) or action not in (1, 2, 3, 4):
            raise MemoryMeasurementError(f"unknown category or action in event {event!r}")
        parsed.append((t, action, nbytes, cat))
    parsed.sort(key=lambda e: e[0])  # stable: events of one timestamp keep their order
    level = [0] * len(CATEGORIES)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    times: list[float] = []
    rows: list[tuple[int, ...]] = []
    t0 = min((t for t, *_ in parsed if t != -1), default=0.0)
    for t, _action, nbytes, cat in parsed:
        level[index[_category(EXPORT_ORDER[cat])]] += nbytes
        t = 0.0 if t == -1 else (t - t0) / 1000.0  # ns -> us since the first event
        if times and times[-1] == t:
            rows[-1] = tuple(level)
        else:
            times.append(t)
            rows.append(tuple(level))
    return MemoryTimeline(tuple(times), tuple(rows), device=device, source=source)


def read_memory_timeline(path: str | os.PathLike[str], *, device: str = "cpu") -> MemoryTimeline:
    """Read a file written by ``torch.profiler.profile.export_memory_timeline``: the ``.json``
    form (``[times, sizes by category]``) or the raw form (``.raw.json``, events); gzipped
    or not."""
    name = os.fspath(path)
    try:
        opener: Callable[..., Any] = gzip.open if name.endswith(".gz") else open
        with opener(name, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise MemoryMeasurementError(f"no memory timeline at {name}") from None
    except (OSError, ValueError) as exc:
        raise MemoryMeasurementError(f"{name} is not a JSON memory timeline: {exc}") from None
    source = f"torch.profiler memory timeline export {os.path.basename(name)}"
    if (
        isinstance(data, list)
        and len(data) == 2
        and isinstance(data[0], list)
        and isinstance(data[1], list)
        and all(isinstance(r, list) and len(r) == len(EXPORT_ORDER) + 1 for r in data[1])
    ):
        # Column 0 of each row is unused by torch; the categories follow in export order.
        times, rows = _rows_from(data[0], [r[1:] for r in data[1]], EXPORT_ORDER)
        return MemoryTimeline(times, rows, device=device, source=source)
    if isinstance(data, list) and all(isinstance(e, list) and len(e) == 4 for e in data):
        return timeline_from_raw_events(data, device=device, source=source)
    raise MemoryMeasurementError(
        f"{name}: neither export_memory_timeline's [times, sizes] nor its raw event list"
    )


def allocator_events(prof: Any) -> list[tuple[float, int, int]]:
    """(time in us, address, signed bytes) of every CPU allocator event a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in time order, read from its
    exported Chrome trace (the public form of those events)."""
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    out = []
    for e in events:
        args = e.get("args") or {}
        if e.get("name") == "[memory]" and "Bytes" in args and args.get("Device Type", 0) == 0:
            out.append((float(e.get("ts", 0.0)), int(args.get("Addr", 0)), int(args["Bytes"])))
    return sorted(out, key=lambda ev: ev[0])


def private_timeline_available() -> bool:
    """Whether this torch still has the memory profiler behind ``export_memory_timeline``
    (``torch.profiler._memory_profiler.MemoryProfileTimeline`` and ``profile._memory_profile``),
    which PyTorch deprecates (FutureWarning: "will be removed in a future version")."""
    try:
        from torch.profiler import profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline
    except ImportError:
        return False
    return hasattr(profile, "_memory_profile") and hasattr(
        MemoryProfileTimeline, "_coalesce_timeline"
    )


def measure_step_timeline(
    step: Callable[[], Any], *, device: str = "cpu", track: Sequence[Any] = ()
) -> MemoryTimeline:
    """Run ``step`` once and return its categorised memory timeline.

    The timeline starts with what is already live (parameters, optimizer state, inputs) and
    follows every allocation and free of the step. Which of torch's instruments measures it
    depends on what this torch has (the timeline's ``source`` says which):

    1. torch's memory profiler (``torch.profiler`` with memory events, shapes and stacks, and
       the private ``_memory_profiler.MemoryProfileTimeline`` behind the deprecated
       ``export_memory_timeline``): categories from the autograd graph and the optimizer;
    2. without it, on a CUDA device: the allocator's history
       (``torch.cuda.memory._record_memory_history`` and ``_snapshot``, what torch's
       deprecation notice points to): categories read from each allocation's stack;
    3. without it elsewhere: ``torch.distributed._tools.mem_tracker.MemTracker``, sampled after
       every operator: parameters, buffers, gradients, activations, temporaries and optimizer
       state of ``track`` (the modules and optimizers live before the step);
    4. without MemTracker: the profiler's memory events, the total only (category "other").
    """
    if private_timeline_available():
        return _profiler_timeline(step, device)
    if device.startswith("cuda"):
        timeline = _history_timeline(step, device)
        if timeline is not None:
            return timeline
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return _event_timeline(step, device)
    return _tracker_timeline(step, device, track, MemTracker)


_PRIVATE_SOURCE = "torch.profiler memory events, categorised by torch's memory profiler"


def _profiler_timeline(step: Callable[[], Any], device: str) -> MemoryTimeline:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with (
        quiet_profiler_stderr(),
        profile(
            activities=activities, profile_memory=True, record_shapes=True, with_stack=True
        ) as prof,
    ):
        step()
    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        timeline = MemoryProfileTimeline(prof._memory_profile())
        times, sizes = timeline._coalesce_timeline(str(torch.device(device)))
    except (ImportError, AttributeError, RuntimeError, AssertionError, KeyError) as exc:
        raise MemoryMeasurementError(
            f"torch's memory profiler could not categorise this step ({exc!r}); "
            "gd.compare still measures its uncategorised peak"
        ) from None
    # _coalesce_timeline rows: column 0 unused, then torch's export order.
    t, rows = _rows_from(times, [r[1:] for r in sizes], EXPORT_ORDER)
    return MemoryTimeline(t, rows, device=device, source=_PRIVATE_SOURCE)


def _tracker_timeline(
    step: Callable[[], Any], device: str, track: Sequence[Any], tracker_type: Any
) -> MemoryTimeline:
    """MemTracker's live bytes by category, sampled before the step and after each operator."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    tracker = tracker_type()
    if track:
        tracker.track_external(*track)
    dev = torch.device(device)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    times: list[float] = []
    rows: list[tuple[int, ...]] = []

    def sample() -> None:
        per_device = tracker.get_tracker_snapshot("current").get(dev, {})
        row = [0] * len(CATEGORIES)
        for key, value in per_device.items():
            name = getattr(key, "value", key)
            if name != "Total":
                row[index[TRACKER_CATEGORIES.get(str(name), "other")]] += int(value)
        times.append(time.perf_counter() * 1e6)
        rows.append(tuple(row))

    class AfterEachOperator(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sample()
            return out

    with repeated_roots_allowed(tracker), tracker:
        sample()  # what is live before the step
        with AfterEachOperator():
            step()
        sample()
    t0 = times[0]
    return MemoryTimeline(
        tuple(t - t0 for t in times),
        tuple(rows),
        device=device,
        source="torch.distributed._tools.mem_tracker.MemTracker, sampled after each operator "
        "(torch's memory profiler is not in this torch)",
    )


def _event_timeline(step: Callable[[], Any], device: str) -> MemoryTimeline:
    """The profiler's allocator events of the step: the total over time, uncategorised."""
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr

    with (
        quiet_profiler_stderr(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        step()
    events = allocator_events(prof)
    other = CATEGORIES.index("other")
    level, lowest = 0, 0
    levels = []
    for _, _, nbytes in events:
        level += nbytes
        lowest = min(lowest, level)
        levels.append(level)
    # Memory live before the step is not in the events: its frees take the level below zero.
    times = tuple(t - events[0][0] for t, _, _ in events) if events else ()
    rows = tuple(
        tuple(lv - lowest if i == other else 0 for i in range(len(CATEGORIES))) for lv in levels
    )
    return MemoryTimeline(
        times,
        rows,
        device=device,
        source="torch.profiler memory events (total only: no categories in this torch)",
        notes=(
            "neither torch's memory profiler nor MemTracker is in this torch: the timeline "
            "is the profiler's allocator events, uncategorised, and memory live before the "
            "step is not counted",
        ),
    )


# Allocation-stack categories (gpudiag.analysis.snapshot_diff) -> timeline categories.
_STACK_CATEGORIES = {
    "parameters": "parameters",
    "optimizer": "optimizer_state",
    "forward": "activations",
    "backward": "gradients",
}


def _history_timeline(step: Callable[[], Any], device: str) -> MemoryTimeline | None:
    """The allocator's history of the step (CUDA); None when it cannot be recorded (the step
    has not run then). Untested on a real GPU in this version: tested with a fake
    ``torch.cuda.memory`` that plays a real recorded snapshot."""
    import torch

    from gpudiag.probe.capture import cuda_memory_history

    reading = cuda_memory_history(step)
    if not reading.ok or not isinstance(reading.value, dict):
        return None
    index = torch.device(device).index or 0
    return timeline_from_snapshot(reading.value, device=device, device_index=index)


def timeline_from_snapshot(
    snapshot: dict[str, Any], *, device: str = "cuda", device_index: int = 0
) -> MemoryTimeline:
    """A categorised timeline from an allocator snapshot with history
    (``torch.cuda.memory._snapshot()`` after ``_record_memory_history``): each allocation's
    category read from its stack (``gpudiag.analysis.snapshot_diff.stack_category``; backward
    allocations, gradients and the backward pass's temporaries alike, count as gradients),
    what was live before the history began from the blocks still live at the end."""
    from gpudiag.analysis.memory_snapshot import analyze_snapshot_data, frame_strings
    from gpudiag.analysis.snapshot_diff import stack_category

    index = {c: i for i, c in enumerate(CATEGORIES)}

    def category(stack: tuple[str, ...]) -> int:
        return index[_STACK_CATEGORIES.get(stack_category(stack), "other")]

    traces = snapshot.get("device_traces") or []
    trace = traces[device_index] if device_index < len(traces) else []
    live: dict[int, tuple[int, int]] = {}  # address -> (bytes, category) allocated in the trace
    deltas: list[tuple[float, int, int]] = []
    for e in trace:
        if not isinstance(e, dict):
            continue
        action, size, addr = e.get("action"), int(e.get("size", 0)), int(e.get("addr", 0))
        if action == "alloc":
            cat = category(frame_strings(e.get("frames")))
            live[addr] = (size, cat)
            deltas.append((float(e.get("time_us", 0)), cat, size))
        elif action == "free_completed":
            size, cat = live.pop(addr, (size, index["other"]))
            deltas.append((float(e.get("time_us", 0)), cat, -size))
    at_end = [0] * len(CATEGORIES)
    for h in analyze_snapshot_data(snapshot, keep_raw=False).holders:
        at_end[index[_STACK_CATEGORIES.get(h.category, "other")]] += h.nbytes
    level = list(at_end)
    for _, cat, nbytes in deltas:
        level[cat] -= nbytes  # back to the start: what was live before the history began
    times: list[float] = [deltas[0][0] if deltas else 0.0]
    rows: list[tuple[int, ...]] = [tuple(max(v, 0) for v in level)]
    for t, cat, nbytes in deltas:
        level[cat] += nbytes
        times.append(t)
        rows.append(tuple(max(v, 0) for v in level))
    t0 = times[0]
    return MemoryTimeline(
        tuple(t - t0 for t in times),
        tuple(rows),
        device=device,
        source="torch.cuda.memory allocator history (_record_memory_history), categories read "
        "from allocation stacks",
    )


@dataclass(frozen=True)
class TracedMemory:
    """Peak of one step traced on fake tensors, by category at the peak moment."""

    peak_bytes: int
    at_peak: dict[str, int]
    device: str
    method: str = (
        "fake tensors (torch._subclasses.fake_tensor) under torch.distributed._tools.MemTracker"
    )


def _kernel_scratch_mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class KernelScratch(TorchDispatchMode):
        """Adds the buffers a CPU kernel allocates for itself, which fake tensors never see.

        Measured with the profiler on torch 2.13 (CPU, oneDNN): ``aten::convolution_backward``
        asked for the input's gradient holds two input-sized buffers besides its outputs (a
        clone through ``aten::contiguous`` and one allocated by the kernel itself, no aten op),
        and ``aten::native_batch_norm_backward`` one input-sized buffer; all are freed before
        the operator returns.
        The same buffers are made here, through the tracker, so they count as temporaries
        while the operator runs.
        """

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            import torch

            scratch = []
            aten = torch.ops.aten
            on_cpu = len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].is_cpu
            if on_cpu and func is aten.convolution_backward.default and args[-1] and args[-1][0]:
                scratch = [torch.empty_like(args[1]), torch.empty_like(args[1])]
            elif on_cpu and func is aten.native_batch_norm_backward.default:
                scratch = [torch.empty_like(args[1])]
            try:
                return func(*args, **(kwargs or {}))
            finally:
                del scratch

    return KernelScratch()


_KernelScratch = _kernel_scratch_mode


@contextmanager
def repeated_roots_allowed(tracker: Any) -> Iterator[None]:
    """Let a tracked step call its model more than once (gradient accumulation).

    MemTracker refuses a second top-level call of a module it has seen ("multiple iterative
    calls") unless its per-module statistics are reset; gpudiag reads only the device-wide
    peak, which a reset keeps. A global forward pre-hook, registered before the tracker's own,
    resets them at each repeated top-level call. Enter this before the tracker.
    """
    from torch.nn.modules.module import register_module_forward_pre_hook

    def reset(module: Any, args: Any) -> None:
        mods = getattr(tracker, "_mod_tracker", None)
        if mods is None or module not in tracker.memory_tracking or mods.is_bw:
            return
        if set(mods.parents) <= {"Global"}:
            tracker.reset_mod_stats()

    handle = register_module_forward_pre_hook(reset)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def fake_tensors() -> Iterator[Any]:
    """A FakeTensorMode in which real inputs are turned fake on first use."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as exc:  # pragma: no cover - torch always ships it from 2.0
        raise MemoryMeasurementError(f"this torch has no fake tensors: {exc}") from None
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        yield mode


def fake_copy(mode: Any, obj: Any) -> Any:
    """A deep copy of ``obj`` (a module) whose tensors are fake: no storage is allocated."""
    import copy

    from torch._subclasses.fake_tensor import FakeCopyMode

    with FakeCopyMode(mode):
        return copy.deepcopy(obj)


def traced_step_memory(
    step: Callable[[], Any], *, track: Sequence[Any], device: str = "cpu"
) -> TracedMemory:
    """Trace ``step`` (called inside ``fake_tensors()``, on fake modules) under MemTracker.

    ``track``: the modules, optimizers and input tensors live before the step, so they count
    in its peak. Call one warm-up step first when the optimizer creates its state lazily.
    """
    import torch

    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:
        raise MemoryMeasurementError(
            f"torch.distributed._tools.mem_tracker is not in this torch build: {exc}"
        ) from None
    tracker = MemTracker()
    tracker.track_external(*track)
    with repeated_roots_allowed(tracker), tracker, _KernelScratch():
        step()
    snapshot = tracker.get_tracker_snapshot("peak")
    dev = torch.device(device)
    per_device = snapshot.get(dev) or next(iter(snapshot.values()), {})
    at_peak = dict.fromkeys(CATEGORIES, 0)
    total = 0
    for key, value in per_device.items():
        name = getattr(key, "value", key)
        if name == "Total":
            total = int(value)
            continue
        at_peak[TRACKER_CATEGORIES.get(str(name), "other")] += int(value)
    return TracedMemory(total or sum(at_peak.values()), at_peak, str(dev))
