"""Diagnose: gather evidence (system, trace, workload, code), run the rules, rank the findings.

``gd.diagnose()`` inspects the machine; with a workload it profiles a few of its steps and
reads its model's source; with a trace it analyses it. Rules whose evidence is missing are
listed as "not evaluated", never passed silently. This module sits above the rules: it is the
one place that runs a workload (profiling, batch scaling) for them and that hands a
``Diagnosis`` the trial runner its ``try_fix`` uses.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect as _inspect
import os
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpudiag._deadline import user_code_failures
from gpudiag._progress import ProgressFn, closed_on_error, finish, resolve
from gpudiag._progress import report as report_progress
from gpudiag.errors import GpuDiagError, GpuDiagWarning
from gpudiag.rules.engine import Diagnosis, EvidenceBundle, run_rules

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport
    from gpudiag.experiment.batch_scaling import BatchScaling
    from gpudiag.probe.system import SystemReport
    from gpudiag.rules.engine import StepTime
    from gpudiag.step import Workload

__all__ = [
    "diagnose",
    "measure_batch_scaling",
    "profile_workload",
    "run_trial",
    "step_time",
    "workload_source",
]


def diagnose(
    workload: Workload | str | None = None,
    trace: TraceReport | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    system: SystemReport | None = None,
    samples: Any = None,
    code: str | None = None,
    *,
    steps: int = 3,
    env: Mapping[str, str] | None = None,
    runtime: Mapping[str, Any] | None = None,
    scaling: BatchScaling | bool = True,
    progress: bool | ProgressFn = True,
    collectives: Any = None,
) -> Diagnosis:
    """Run every rule over the evidence given or cheaply gathered; findings ranked by gain.

    ``workload``: a ``gd.Workload`` or a demo name (``"gpt"``, ``"mlp"``, ...); without a
    ``trace`` it is profiled for ``steps`` steps (on a copy of its model when gpudiag owns the
    step; a ``Workload.from_step`` function is called as it is), and its model's module source
    is scanned when no ``code`` is given. ``trace``: a ``TraceReport``, a trace file path, or
    a list of them (one per rank).
    ``system``: a ``SystemReport`` (default: ``gd.inspect()``, which never raises).
    ``samples``: monitor samples. ``code``: source text to scan for API misuse.
    ``runtime``: this process's torch switches and profiling-counter permission (default:
    ``gpudiag.probe.runtime.runtime_state()``, read now). ``env``: the job's environment
    variables (default: this process's). Neither default is read when ``system`` is a
    recording or ``trace`` is a file: they describe this process, not the job that was
    recorded; the rules that need them say "not evaluated".
    ``scaling``: time the workload's step at its batch and at 4x it (``batch_scaling``, a few
    seconds) to see whether a fixed per-step cost dominates; ``False`` skips it, a
    ``BatchScaling`` is used as given. ``progress``: bars over the profile and the batch
    scaling (``True``), none (``False``), or a callback that gets a ``gpudiag._progress.Progress``
    per step or round and ``finished`` after each stage. ``collectives``: measured collective
    bandwidth (``gd.bench.allreduce`` results or ``parse_nccl_tests`` logs), judged against the
    topology.
    """
    on_progress = resolve(progress)
    wl: Workload | None
    if isinstance(workload, str):
        from gpudiag.workloads import get

        wl = get(workload)
    else:
        wl = workload
    if system is None:
        from gpudiag.probe.system import inspect

        system = inspect()
    from gpudiag.analysis.trace import TraceReport, analyze_trace

    report = (
        trace
        if trace is None or isinstance(trace, TraceReport)
        else analyze_trace(trace, progress=on_progress or False)
    )
    trace_file = report is not trace
    profiled_here = report is None and wl is not None
    measured: BatchScaling | None = None if scaling is True else (scaling or None)
    if wl is not None and (profiled_here or scaling is True):
        # The user's step runs here: their objects, torch's switches, the working directory,
        # sys.argv and the environment are put back afterwards, whatever the step did.
        from gpudiag.experiment.step_limit import shared_limits
        from gpudiag.experiment.trial import isolated

        with user_code_failures("gd.diagnose"), shared_limits(wl), isolated(*wl.protected):
            if profiled_here:
                report = profile_workload(wl, steps=steps, on_progress=on_progress)
            if scaling is True:
                measured = measure_batch_scaling(wl, on_progress=on_progress)
            timed = step_time(
                wl if profiled_here else None,
                report,
                measured,
                steps=steps,
                on_progress=on_progress,
            )
    else:
        timed = step_time(None, report, measured, steps=steps, on_progress=on_progress)
    if code is None and wl is not None:
        code = workload_source(wl)
    # This process's torch switches and environment describe the job only when the job runs
    # here: a recorded machine's process is gone, and a trace file may come from anywhere.
    this_process = not system.is_recording and not trace_file
    if runtime is None and this_process:
        from gpudiag.probe.runtime import runtime_state

        runtime = runtime_state()
    evidence = EvidenceBundle(
        system=system,
        trace=report,
        samples=samples,
        workload=wl,
        code=code,
        runtime=runtime,
        batch_scaling=measured,
        collectives=collectives,
        env=dict(env) if env is not None else dict(os.environ) if this_process else None,
    )
    # With a workload, rules may measure (the CPU bf16 matmul speed): a bar says so.
    rules_progress = on_progress if wl is not None else None
    report_progress(rules_progress, "rules", 0, 1, "running the rules")
    diagnosis = run_rules(evidence, trial=run_trial)
    finish(rules_progress, "rules")
    return dataclasses.replace(diagnosis, step_time=timed)


def run_trial(workload: Any, fixes: list[Any], **compare_options: Any) -> Any:
    """``Diagnosis.try_fix``'s trial: ``gd.compare`` on the diagnosed workload."""
    from gpudiag.trials import compare

    return compare(workload, fixes=fixes, **compare_options)


def step_time(
    workload: Workload | None,
    trace: TraceReport | None,
    scaling: BatchScaling | None,
    *,
    steps: int = 3,
    on_progress: ProgressFn | None = None,
) -> StepTime | None:
    """The step's own time, measured without the profiler, beside a profiled step's (None
    when no step was run or recorded).

    From the batch scaling's rounds at the workload's batch when it measured at least
    ``MIN_TIMED``; else, for a ``workload`` (one this diagnosis profiled), ``steps`` (at least
    ``MIN_TIMED``) steps timed on a copy after a warm-up; else the scaling's one round, said to
    be one sample; else not measured (a trace alone holds only profiled steps). The source says
    the timings' spread (IQR / median).
    """
    from gpudiag.rules.engine import StepTime

    if trace is None and scaling is None and workload is None:
        return None  # no step was run or recorded: nothing to time
    window = [s for s in trace.steps() if s.in_window] if trace is not None else []
    window = window or (list(trace.steps()) if trace is not None else [])
    profiled = (
        statistics.fmean(s.duration_us for s in window) / 1e6
        if window and all(s.duration_us > 0 for s in window)
        else None
    )
    if scaling is not None and len(scaling.rounds) >= MIN_TIMED:
        spread = _spread([small for small, _ in scaling.rounds])
        return StepTime(
            scaling.step_s,
            f"without the profiler (median of {len(scaling.rounds)} interleaved rounds at "
            f"batch {scaling.batch_size}, from the batch scaling; {spread})",
            profiled,
        )
    if workload is None:
        if scaling is not None:  # stopped early and no step of ours to time again
            return StepTime(
                scaling.step_s,
                f"without the profiler (one round at batch {scaling.batch_size}, from the "
                "batch scaling: one sample, its spread unknown)",
                profiled,
            )
        return StepTime(None, "only profiled steps were given", profiled)
    # The batch scaling stops after one round once its question is answered: one sample is no
    # step time (it read 14 ms, then 1.4 s, on a busy host), so the step is timed on its own.
    steps = max(steps, MIN_TIMED)
    try:
        times = _timed_steps(workload, steps, on_progress)
    except Exception as exc:  # the profile ran the step; timing it again is a nicety
        warnings.warn(f"step time not measured: {exc}", GpuDiagWarning, stacklevel=3)
        return StepTime(None, f"timing the step failed: {exc}", profiled)
    return StepTime(
        statistics.median(times),
        f"without the profiler (median of {steps} steps after a warm-up; {_spread(times)})",
        profiled,
    )


# The fewest timings a step time is the median of (a median of fewer says nothing of spread).
MIN_TIMED = 3


def _spread(times: Sequence[float]) -> str:
    """``IQR 4% of the median``: how far the timings behind a median step time spread."""
    from gpudiag.analysis.measurement import Measurement

    spread = Measurement(tuple(times)).relative_spread
    return f"IQR {spread:.0%} of the median" if spread == spread else "spread unknown"


def _timed_steps(workload: Workload, steps: int, on_progress: ProgressFn | None) -> list[float]:
    """Wall times of ``steps`` steps of the workload (on a copy), after one warm-up; on a GPU
    the device is synchronised around each step (that path is untested on a real GPU)."""
    import time

    from gpudiag.probe import cuda

    step = _step_function(workload)
    sync = cuda.synchronize if workload.device_type == "cuda" else None
    stage = "step time"
    report_progress(on_progress, stage, 0, steps + 1, "warm-up")
    times = []
    with closed_on_error(on_progress):
        step()
        for i in range(steps):
            report_progress(on_progress, stage, i + 1, steps + 1)
            if sync is not None:
                sync()
            start = time.perf_counter()
            step()
            if sync is not None:
                sync()
            times.append(time.perf_counter() - start)
    finish(on_progress, stage)
    return times


def measure_batch_scaling(
    workload: Workload | None, on_progress: ProgressFn | None = None
) -> BatchScaling | None:
    """``batch_scaling`` of the workload when its batch can be resized (None otherwise, or
    when the measurement itself fails: the rule then says it was not evaluated)."""
    from gpudiag.experiment.batch_scaling import batch_scaling, can_scale

    if workload is None or can_scale(workload) is not None:
        return None
    from gpudiag.rules.steps import FIXED_SHARE

    try:
        return batch_scaling(workload, stop_below=FIXED_SHARE, on_progress=on_progress)
    except Exception as exc:  # a workload that breaks at another batch size is not our fault
        warnings.warn(f"batch scaling not measured: {exc}", GpuDiagWarning, stacklevel=3)
        return None


def _step_function(workload: Any) -> Callable[[], Any]:
    """One training step of ``workload`` (forward, loss, backward, optimizer), on a copy,
    within the workload's step limit (gpudiag.experiment.step_limit)."""
    from gpudiag.experiment.step_limit import guarded, limit_for
    from gpudiag.step import Step, Workload

    if not isinstance(workload, Workload):
        raise GpuDiagError("diagnose(workload=) needs a gd.Workload or a demo workload name")
    limit = limit_for(workload)
    if workload.step_fn is not None:
        return guarded(workload.step_fn, limit, f"the step {workload.name!r}")
    training = Step.of(workload, copy.deepcopy(workload.model))
    training.new_optimizer()

    def step() -> None:
        training.run()

    step.__name__ = f"diagnose_{workload.name}"
    return guarded(step, limit, f"the step of {workload.name!r}")


def profile_workload(
    workload: Workload,
    steps: int = 3,
    trace_dir: str | None = None,
    on_progress: ProgressFn | None = None,
) -> Any:
    """A short ``gd.profile`` of the workload's step (one warm-up step, then ``steps``)."""
    import tempfile

    from gpudiag.profiling import profile

    step = _step_function(workload)
    progress = on_progress if on_progress is not None else False
    if trace_dir is not None:
        return profile(step, steps=steps, warmup=1, trace_dir=trace_dir, progress=progress)
    with tempfile.TemporaryDirectory(prefix="gpudiag-diagnose-") as tmp:
        return profile(step, steps=steps, warmup=1, trace_dir=tmp, progress=progress)


def workload_source(workload: Workload) -> str | None:
    """The source the code rules read: the module that defines the workload's model class (or
    step), when that module's file is where the class was written; else the text the class
    was written in, with that of the model's other classes from the same module (its
    blocks). A class defined in a notebook cell lives in ``__main__``, which has no file in
    Jupyter (getsource fails) and is the driving script in a scripted IPython (the wrong
    text): IPython keeps each cell's text in ``linecache``, under the name its code carries."""
    import linecache

    target = workload.model
    obj: Any = type(target) if target is not None else workload.step_fn
    if obj is None:
        return None
    written = _written_at(obj)
    module = _inspect.getmodule(obj)
    module_file = getattr(module, "__file__", None)
    if module is not None and (written is None or _same_file(written[0], module_file)):
        try:
            return _inspect.getsource(module)
        except (OSError, TypeError):
            pass
    texts: dict[str, str] = {}  # by cell (or file), in the order the classes come
    for part in _own_classes(target, obj):
        place = _written_at(part)
        if place is not None and place[0] not in texts:
            texts[place[0]] = "".join(linecache.getlines(place[0]))
    text = "\n".join(t for t in texts.values() if t)
    if text:
        return text
    try:
        return _inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _own_classes(target: Any, obj: Any) -> list[Any]:
    """``obj`` and the classes of the model's submodules defined in the same module (a
    notebook's blocks beside its model), each once."""
    found = [obj]
    modules = getattr(target, "modules", None)
    if target is None or not callable(modules):
        return found
    for sub in modules():
        kind = type(sub)
        if kind.__module__ == obj.__module__ and kind not in found:
            found.append(kind)
    return found


def _written_at(obj: Any) -> tuple[str, int] | None:
    """(file name, first line) of a function, or of the earliest method a class defines
    itself; None when no code object says (a class with no methods of its own)."""
    if not isinstance(obj, type):
        code = getattr(_inspect.unwrap(obj), "__code__", None) if callable(obj) else None
        return (code.co_filename, code.co_firstlineno) if code is not None else None
    places = []
    for member in vars(obj).values():
        function = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
        code = getattr(function, "__code__", None)
        own = getattr(function, "__qualname__", "").startswith(f"{obj.__qualname__}.")
        if code is not None and own:
            places.append((code.co_filename, code.co_firstlineno))
    return min(places, key=lambda place: place[1]) if places else None


def _same_file(a: str, b: str | None) -> bool:
    return b is not None and os.path.realpath(a) == os.path.realpath(b)
