"""Memory of a step: %gpudiag memory (a Workload or demo) or %%gpudiag memory (the cell).

``%gpudiag memory --workload wl [--fit] [--budget 2GiB]`` estimates and measures one step of a
``gd.Workload`` variable (or a demo name) on a copy; ``--fit`` finds the largest micro-batch
under the budget. ``%%gpudiag memory [--budget 512MiB]`` runs the cell once as the step,
measures its memory by category, and with a budget stops it at an out-of-memory that the
report explains; the torch modules and optimizers the cell uses, and the notebook variables it
assigns, are restored afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from gpudiag.commands.memory import add_arguments as _add_cli_arguments
from gpudiag.commands.memory import compute
from gpudiag.errors import GpuDiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_cli_arguments(parser)
    parser.add_argument(
        "--workload", dest="workload_var", metavar="NAME", help="a gd.Workload variable or demo"
    )


def _cell_report(
    cell: str, namespace: dict[str, Any], budget: Any, step_timeout_s: float | None = None
) -> Any:
    from gpudiag._deadline import user_code_failures
    from gpudiag.experiment.memory_report import MemoryReport, parse_budget
    from gpudiag.experiment.step_limit import StepLimit
    from gpudiag.experiment.trial import isolated
    from gpudiag.magics.compare import _bindings_restored, _names, _torch_objects, compile_cell
    from gpudiag.profiling.memory import MemoryTimeline, measure_step_timeline
    from gpudiag.profiling.memory_budget import MemoryBudget, MemoryBudgetExceeded

    code = compile_cell(cell, "<%%gpudiag memory cell>")
    names = _names(code)
    modules, optimizers = _torch_objects(names, namespace)
    budget_bytes = parse_budget(budget)
    limit = StepLimit(fixed_s=step_timeout_s)

    def step() -> None:
        with contextlib.redirect_stdout(io.StringIO()), limit.guard("the cell"):
            if budget_bytes is None:
                exec(code, namespace)  # the user's own cell, in their own namespace
            else:
                with MemoryBudget(budget_bytes, track=[*modules, *optimizers]):
                    exec(code, namespace)

    oom = None
    timeline = MemoryTimeline((), (), source="not measured")
    with (
        user_code_failures("%%gpudiag memory"),
        _bindings_restored(names, namespace),
        isolated(*modules, *optimizers),
    ):
        try:
            timeline = measure_step_timeline(step)
        except MemoryBudgetExceeded as exc:
            oom = exc.oom
    return MemoryReport(
        "cell",
        timeline,
        budget_bytes=budget_bytes,
        oom=oom,
        notes=("the cell ran once as the step; its modules, optimizers and variables restored",),
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    if cell is not None and cell.strip():
        report = _cell_report(cell, namespace, args.budget, args.step_timeout)
        return report.to_dict() if args.json else report
    name = args.workload_var or args.workload
    workload = None
    if name is not None:
        from gpudiag.experiment.workload import Workload

        value = namespace.get(name)
        if isinstance(value, Workload):
            workload = value
        elif value is not None:
            raise GpuDiagError(f"{name} is a {type(value).__name__}, not a gd.Workload")
        else:
            args.workload = name
    elif not (args.snapshot or args.config):
        raise GpuDiagError(
            "use %%gpudiag memory over a cell (the cell is the step), or %gpudiag memory "
            "--workload NAME (a gd.Workload variable or a demo), --config FILE or --snapshot FILE"
        )
    result, findings = compute(args, workload)
    if args.json:
        return {**result.to_dict(), "findings": findings.to_dict()}
    from IPython.display import display

    display(result)
    if findings.findings:
        display(findings)
    return None
