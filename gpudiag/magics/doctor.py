"""Inspect, profile a few steps of a workload and diagnose (``%gpudiag doctor``)."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.errors import GpuDiagError

DEMO = "mlp"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", metavar="T", help="diagnose this trace instead of profiling")
    parser.add_argument(
        "--workload",
        metavar="NAME",
        help="a demo workload name, or a gd.Workload variable of the notebook "
        f"(default: the demo {DEMO!r})",
    )
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (3)")
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
        "--budget", type=float, default=30.0, help="seconds a Try-it comparison may take (30)"
    )


def _workload(name: str | None, shell: Any) -> Any:
    from gpudiag.experiment.workload import Workload

    if name is None:
        return DEMO
    value = getattr(shell, "user_ns", {}).get(name)
    if isinstance(value, Workload):
        return value
    from gpudiag.workloads import names

    if name in names():
        return name
    raise GpuDiagError(
        f"--workload {name!r} is neither a gd.Workload variable of this notebook nor a demo "
        f"workload ({', '.join(names())})"
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    from gpudiag._progress import ProgressBar
    from gpudiag.probe.system import inspect
    from gpudiag.rules import diagnose

    if args.steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    system = inspect(replay=args.replay)
    if args.trace:
        return diagnose(trace=args.trace, system=system)
    bar = ProgressBar("doctor")  # profiling and batch scaling take seconds: show them
    diagnosis = diagnose(
        workload=_workload(args.workload, shell),
        system=system,
        steps=args.steps,
        scaling=not args.no_scaling,
        progress=bar,
    )
    bar.close(complete=True)
    if args.no_widget:
        return diagnosis
    from gpudiag.ui.diagnosis import DiagnosisView

    return DiagnosisView(diagnosis, time_budget_s=args.budget)
