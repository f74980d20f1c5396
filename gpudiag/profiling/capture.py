"""Capture: torch.profiler around repeated calls of a step function, with a schedule."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag._native_stderr import quiet_profiler_stderr
from gpudiag._progress import ProgressFn, finish, report, resolve
from gpudiag.errors import GpuDiagError
from gpudiag.probe import cuda

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.trace import TraceReport

# Where traces go when no trace_dir is given (relative to the working directory, as
# tensorboard_trace_handler's folders are).
DEFAULT_TRACE_DIR = "gpudiag_traces"


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GpuDiagError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def _trace_path(trace_dir: str | os.PathLike[str] | None, fn: Callable[..., Any]) -> Path:
    folder = Path(trace_dir if trace_dir is not None else DEFAULT_TRACE_DIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuDiagError(
            f"cannot create the trace folder {folder}: {exc.strerror or exc}. "
            "Pass trace_dir= a writable folder."
        ) from None
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", getattr(fn, "__name__", "step"))[:40] or "step"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return folder / f"{label}.{stamp}.{os.getpid()}.pt.trace.json.gz"


def profile(
    fn: Callable[..., Any],
    *args: Any,
    steps: int = 5,
    warmup: int = 1,
    wait: int = 0,
    trace_dir: str | os.PathLike[str] | None = None,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    on_progress: ProgressFn | None = None,
    progress: bool | ProgressFn = True,
    **kwargs: Any,
) -> TraceReport:
    """Call ``fn(*args, **kwargs)`` ``wait + warmup + steps`` times under ``torch.profiler``.

    The profiler records the CPU, and CUDA too when a GPU is present, with a
    wait/warmup/active schedule (only the ``steps`` active calls are kept; warm-up calls run
    the profiler without keeping their events, so start-up costs stay out). Shapes, memory
    and Python stacks are recorded (stacks give the call sites of sync points). Each call is
    one ``ProfilerStep``. The trace is saved as ``<trace_dir>/<fn>.<time>.<pid>.pt.trace.json.gz``
    (``trace_dir`` defaults to ``./gpudiag_traces``) and analysed with every step kept
    (the GPU is synchronised before the last step ends, so its kernels are complete).

    ``progress``: a bar over the calls (``True``), none (``False``), or a callback that gets a
    ``Progress("profile", calls done, calls in all)`` after each call and ``finished`` once the
    trace is saved (before it is analysed); ``on_progress``, when given, is that callback
    (and ``progress`` is then ignored).

    On a machine without CUDA the trace is CPU-only: the report says what it can tell (CPU
    operators, steps, DataLoader share, host-copy operators) and what it cannot.
    An exception raised by ``fn`` propagates unchanged.
    """
    if not callable(fn):
        raise GpuDiagError(f"profile() needs a function to call, got {type(fn).__name__}.")
    if on_progress is None:
        on_progress = resolve(progress, "profile")
    steps = _count("steps", steps, 1)
    warmup = _count("warmup", warmup, 0)
    wait = _count("wait", wait, 0)
    path = _trace_path(trace_dir, fn)

    from torch.profiler import ProfilerActivity, schedule
    from torch.profiler import profile as torch_profile

    from gpudiag.analysis.trace import analyze_trace

    on_gpu = cuda.available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    saved: list[Path] = []

    def save(prof: Any) -> None:
        prof.export_chrome_trace(str(path))
        saved.append(path)

    total = wait + warmup + steps
    with (
        quiet_profiler_stderr(),
        torch_profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=save,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        ) as prof,
    ):
        for i in range(total):
            fn(*args, **kwargs)
            if on_gpu and i == total - 1:
                cuda.synchronize()
            prof.step()
            report(on_progress, "profile", i + 1, total)
    finish(on_progress, "profile")
    if not saved:  # pragma: no cover - torch calls on_trace_ready after the last active step
        raise GpuDiagError("torch.profiler produced no trace; nothing to analyse.")
    return analyze_trace(path, include_last_step=True, progress=on_progress or False)
