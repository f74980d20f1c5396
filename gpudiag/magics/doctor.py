"""Diagnose your training step: the cell (%%), a Workload, or a demo (%gpudiag doctor).

``%%gpudiag doctor`` runs the cell as one training step, the way ``%%gpudiag compare`` does:
the model, optimizer and batch are the notebook's variables the cell uses; the cell is
profiled for a few steps and the torch modules and optimizers it uses are restored afterwards,
and so are the notebook variables it assigns. Its printed output is silenced while it runs.
Without a cell or ``--workload``, doctor diagnoses a built-in demo and says so first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from gpudiag._values import arg_float, arg_int
from gpudiag.commands.compare import add_step_timeout, with_step_timeout
from gpudiag.errors import GpuDiagError, StepFailedError

DEMO = "mlp"
CELL_FILENAME = "<%%gpudiag doctor cell>"  # what tracebacks from the user's cell say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", metavar="T", help="diagnose this trace instead of profiling")
    parser.add_argument(
        "--workload",
        metavar="NAME",
        help="line form: a gd.Workload variable of the notebook, or a demo workload "
        f"(without it and without a cell: the demo {DEMO!r})",
    )
    parser.add_argument("--steps", type=arg_int(1, 10_000), default=3, help="profiled steps (3)")
    parser.add_argument(
        "--no-scaling",
        action="store_true",
        help="skip timing the workload at 4x its batch (the per-step overhead rule)",
    )
    parser.add_argument("--replay", metavar="FILE", help="a recorded machine (nvidia-smi XML)")
    parser.add_argument(
        "--no-widget",
        action="store_true",
        help="return the Diagnosis itself instead of the card with Try-it buttons",
    )
    parser.add_argument(
        "--budget",
        type=arg_float(0, 86_400, low_open=True),
        default=30.0,
        help="seconds a Try-it comparison may take (30)",
    )
    add_step_timeout(parser)


def demo_note(name: str) -> str:
    """What doctor says first when it diagnoses a demo rather than the user's code."""
    from gpudiag.workloads import WORKLOADS

    return (
        f"gpudiag doctor: diagnosing the built-in demo workload {name!r} "
        f"({WORKLOADS[name][1]}), not your code. For your own training step, run it as the "
        "cell of %%gpudiag doctor (model, optimizer and batch from your variables), or pass "
        "--workload WL with WL = gd.Workload(...)."
    )


def _workload(name: str | None, shell: Any) -> tuple[Any, str]:
    """The workload (or demo name) to diagnose, and a note saying what it is."""
    from gpudiag.experiment.workload import Workload

    if name is None:
        return DEMO, demo_note(DEMO)
    value = getattr(shell, "user_ns", {}).get(name)
    if isinstance(value, Workload):
        return value, f"gpudiag doctor: diagnosing the notebook's workload {name!r}."
    from gpudiag.workloads import names

    if name in names():
        return name, demo_note(name)
    raise GpuDiagError(
        f"--workload {name!r} is neither a gd.Workload variable of this notebook nor a demo "
        f"workload ({', '.join(names())})"
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    from gpudiag._progress import ProgressBar
    from gpudiag.doctor import diagnose
    from gpudiag.probe.system import inspect

    if args.steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    if cell is not None and cell.strip() and (args.workload or args.trace):
        raise GpuDiagError(
            "%%gpudiag doctor diagnoses its cell: drop --workload/--trace, or use the line "
            "form %gpudiag doctor --workload NAME"
        )
    if args.trace:
        return diagnose(trace=args.trace, system=inspect(replay=args.replay))
    bar = ProgressBar("doctor")  # profiling and batch scaling take seconds: show them
    if cell is not None and cell.strip():
        from gpudiag.experiment.trial import isolated
        from gpudiag.magics.compare import _bindings_restored, cell_workload

        namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
        workload, names = cell_workload(cell, namespace, each_run_restored=True, magic="doctor")
        workload.step_timeout_s = args.step_timeout
        note = "gpudiag doctor: diagnosing the cell as your training step."
        system = inspect(replay=args.replay)
        try:
            with (
                _bindings_restored(names, namespace),
                isolated(*workload.protected),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                diagnosis = diagnose(
                    workload=workload,
                    system=system,
                    steps=args.steps,
                    scaling=not args.no_scaling,
                    progress=bar,
                )
        except Exception as exc:
            bar.close(complete=False)
            # gd.diagnose reports the user's own exception as StepFailedError: its cause.
            cause = exc.__cause__ if isinstance(exc, StepFailedError) else exc
            if not isinstance(cause, BaseException) or not _raised_in_cell(cause):
                raise
            raise GpuDiagError(
                f"the cell failed when run as a training step: {type(cause).__name__}: {cause} "
                "(run it as a plain cell first to see the traceback)"
            ) from cause
    else:
        workload, note = _workload(args.workload, shell)
        if not isinstance(workload, str):
            workload = with_step_timeout(workload, args.step_timeout)
        print(note)  # first, before the profiling: the user knows what is being diagnosed
        diagnosis = diagnose(
            workload=workload,
            system=inspect(replay=args.replay),
            steps=args.steps,
            scaling=not args.no_scaling,
            progress=bar,
        )
    bar.close(complete=True)
    if args.no_widget:
        return diagnosis
    return doctor_view(diagnosis, note=note, time_budget_s=args.budget)


def _raised_in_cell(exc: BaseException) -> bool:
    """The exception came out of the user's cell (a bug of theirs, not of gpudiag)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == CELL_FILENAME:
            return True
        tb = tb.tb_next
    return False


def doctor_view(diagnosis: Any, *, note: str = "", **compare_options: Any) -> Any:
    """The diagnosis card: the note, where the step's time goes (a bar), then the findings."""
    from gpudiag.ui.diagnosis import DiagnosisView

    figure = None
    if diagnosis.trace is not None:
        from gpudiag.plots.trace import step_time_figure

        figure = step_time_figure(diagnosis.trace)
    return DiagnosisView(diagnosis, note=note, figure=figure, **compare_options)
