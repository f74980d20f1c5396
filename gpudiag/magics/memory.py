"""Memory of a step: %gpudiag memory (a Workload or demo) or %%gpudiag memory (the cell).

``%gpudiag memory --workload wl [--fit] [--budget 2GiB]`` estimates and measures one step of a
``gd.Workload`` variable (or a demo name) on a copy; ``--fit`` finds the largest micro-batch
under the budget. ``%%gpudiag memory [--budget 512MiB]`` runs the cell as the step: once to
make the optimizer state, then measured by category (``--first-step`` measures the first run
and says so), beside an estimate traced on fake copies of what the cell uses, as gd.memory
does (``--no-estimate`` skips it); with a budget it stops at an out-of-memory that the report
explains. The torch modules and optimizers the cell uses (also through the notebook's
functions it calls), and the notebook variables it assigns, are restored afterwards; what
else the cell changes (an iterator it advances) stays changed, and the cell runs up to four
times (twice on fakes for the estimate, a warm-up, the measured run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import types
from typing import Any

from gpudiag._progress import ProgressFn, Stages, closed_on_error, resolve
from gpudiag.commands.memory import add_arguments as _add_cli_arguments
from gpudiag.commands.memory import compute
from gpudiag.errors import GpuDiagError, StepExitError, StepTimeoutError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_cli_arguments(parser)
    parser.add_argument(
        "--workload", dest="workload_var", metavar="NAME", help="a gd.Workload variable or demo"
    )
    parser.add_argument(
        "--first-step",
        action="store_true",
        help="cell form: measure the cell's first run, before the optimizer state exists "
        "(default: run it once first, then measure a warm step, as gd.memory does)",
    )
    parser.add_argument(
        "--no-estimate",
        action="store_true",
        help="cell form: no estimate column (the cell does not run on fake tensors)",
    )


def _reached_names(code: types.CodeType, namespace: dict[str, Any]) -> set[str]:
    """The notebook names the cell uses, and those its notebook functions use (a cell that
    calls ``train_step()`` steps the model that function reads), transitively."""
    from gpudiag.magics.compare import _names

    names: set[str] = set()
    todo = [code]
    while todo:
        for name in _names(todo.pop()) - names:
            names.add(name)
            value = namespace.get(name)
            if isinstance(value, types.FunctionType) and value.__globals__ is namespace:
                todo.append(value.__code__)
    return names


def _silently(code: types.CodeType, namespace: dict[str, Any]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, namespace)  # the user's own cell, in their own namespace


def _warm_up_note(first_step: bool, optimizers: list[Any], warm_before: bool) -> str:
    if first_step:
        return "measured the cell's first run (--first-step): " + (
            "the optimizer state existed already"
            if warm_before
            else "the optimizer state did not exist yet (the optimizer creates it inside "
            "the step), so the peak can differ from a training step's"
        )
    if warm_before:
        return "the optimizer state existed before the cell ran: the measured run is a warm step"
    if optimizers:
        return (
            "the cell ran twice: once to create the optimizer state, then measured (a warm "
            "step, as gd.memory measures)"
        )
    return (
        "the cell ran twice (a warm-up, then measured); no optimizer among the variables it "
        "uses, so whether optimizer state was made cannot be told"
    )


def _cell_report(
    cell: str,
    namespace: dict[str, Any],
    budget: Any,
    *,
    first_step: bool = False,
    estimate: bool = True,
    progress: bool | ProgressFn = True,
    step_timeout_s: float | None = None,
) -> Any:
    from gpudiag._deadline import user_code_failures
    from gpudiag.experiment.memory_report import MemoryReport, parse_budget
    from gpudiag.experiment.step_limit import StepLimit, guarded
    from gpudiag.experiment.trial import isolated
    from gpudiag.magics.compare import _bindings_restored, _torch_objects, compile_cell
    from gpudiag.profiling.memory import MemoryTimeline, measure_step_timeline
    from gpudiag.profiling.memory_budget import MemoryBudget, MemoryBudgetExceeded

    code = compile_cell(cell, "<%%gpudiag memory cell>")
    names = _reached_names(code, namespace)
    modules, optimizers = _torch_objects(names, namespace)
    budget_bytes = parse_budget(budget)
    limit = StepLimit(fixed_s=step_timeout_s)

    # Every run of the cell is a step under the step limit: the first real run's time limits
    # the later ones (gpudiag.experiment.step_limit); the runs on fake tensors get the first
    # step's limit.
    run_cell = guarded(lambda: _silently(code, namespace), limit, "the cell")

    def step() -> None:
        if budget_bytes is None:
            run_cell()
        else:
            with MemoryBudget(budget_bytes, track=[*modules, *optimizers]):
                run_cell()

    oom = None
    timeline = MemoryTimeline((), (), source="not measured")
    warm_before = any(len(opt.state) for opt in optimizers)
    notes = [_warm_up_note(first_step, optimizers, warm_before)]
    traced = None
    warm_up = not (first_step or warm_before)
    stages = Stages(resolve(progress, "memory"), "cell", 1 + warm_up + estimate)
    with (
        user_code_failures("%%gpudiag memory"),
        closed_on_error(stages.on_progress),
        _bindings_restored(names, namespace),
        isolated(*modules, *optimizers),
    ):
        if estimate:
            stages.next("the estimate (the cell twice on fake tensors)")
            try:
                with _bindings_restored(names, namespace):  # the fakes leave before the run
                    traced = _cell_estimate(code, names, namespace, limit)
            except (StepTimeoutError, StepExitError):
                raise  # the cell hangs or exits on fake tensors: it would for real too
            except Exception as exc:  # a comparison; the measurement stands alone
                notes.append(f"no estimate: {type(exc).__name__}: {exc}")
        if warm_up:
            stages.next("a warm-up run (the optimizer makes its state)")
            run_cell()
        stages.next("the measured run (profiled)")
        try:
            timeline = measure_step_timeline(step, track=[*modules, *optimizers])
        except MemoryBudgetExceeded as exc:
            oom = exc.oom
    stages.finish()
    notes.append("its modules, optimizers and variables restored afterwards")
    return MemoryReport(
        "cell", timeline, estimate=traced, budget_bytes=budget_bytes, oom=oom, notes=tuple(notes)
    )


def _cell_estimate(
    code: types.CodeType, names: set[str], namespace: dict[str, Any], limit: Any
) -> Any:
    """The cell's steady-state peak traced on fake tensors (nothing allocated): the notebook's
    modules, optimizers and tensors the cell reaches are swapped for fake copies while it runs
    twice (the first run makes the optimizer state), as gd.estimate_memory traces a workload.
    The caller restores the notebook's variables."""
    import torch

    from gpudiag.analysis.memory_estimate import MemoryEstimate, MemoryEstimateError
    from gpudiag.profiling.memory import fake_copy, fake_tensors, traced_step_memory
    from gpudiag.step import constructor_settings

    with fake_tensors() as mode:
        fakes: dict[str, Any] = {}
        copies: dict[int, Any] = {}  # id(real module) -> its fake copy
        params: dict[int, Any] = {}  # id(real parameter) -> its fake
        values = {n: namespace[n] for n in sorted(names) if n in namespace}
        for name, value in values.items():
            if isinstance(value, torch.nn.Module):
                if id(value) not in copies:
                    copies[id(value)] = fake_copy(mode, value)
                    for real, fake in zip(
                        value.parameters(), copies[id(value)].parameters(), strict=True
                    ):
                        params[id(real)] = fake
                fakes[name] = copies[id(value)]
            elif isinstance(value, torch.Tensor):
                fakes[name] = mode.from_tensor(value)
        for name, value in values.items():
            if isinstance(value, torch.optim.Optimizer):
                groups = []
                for group in value.param_groups:
                    if any(id(p) not in params for p in group["params"]):
                        raise MemoryEstimateError(
                            f"the optimizer {name!r} updates parameters of a module the cell "
                            "does not name"
                        )
                    groups.append({**group, "params": [params[id(p)] for p in group["params"]]})
                cls = type(value)
                fakes[name] = cls(groups, **constructor_settings(cls, value.defaults))
        namespace.update(fakes)
        track = list(fakes.values())
        with limit.guard("the cell on fake tensors", first=True):
            _silently(code, namespace)  # the optimizer makes its state, as in a warm step

        def traced_run() -> None:
            with limit.guard("the cell on fake tensors", first=True):
                _silently(code, namespace)

        traced = traced_step_memory(traced_run, track=track, device=_device(fakes))
    return MemoryEstimate(
        peak_bytes=traced.peak_bytes,
        breakdown=traced.at_peak,
        route="traced",
        model="cell",
        assumptions=(
            "the cell run twice on fake tensors (its modules, optimizers and tensors copied "
            "as fakes), the second traced: nothing allocated",
            "what operators declare; a CPU kernel's private scratch (oneDNN conv/batch-norm "
            "backward) and allocator rounding on a GPU are not seen",
        ),
    )


def _device(fakes: dict[str, Any]) -> str:
    import torch

    for value in fakes.values():
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                return p.device.type
    return "cpu"


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    if cell is not None and cell.strip():
        report = _cell_report(
            cell,
            namespace,
            args.budget,
            first_step=args.first_step,
            estimate=not args.no_estimate,
            progress=not args.json,
            step_timeout_s=args.step_timeout,
        )
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
    elif not (args.snapshot or args.config or args.diff):
        raise GpuDiagError(
            "use %%gpudiag memory over a cell (the cell is the step), or %gpudiag memory "
            "--workload NAME (a gd.Workload variable or a demo), --config FILE, --snapshot FILE "
            "(or a folder of per-rank snapshots) or --diff BEFORE AFTER"
        )
    result, findings = compute(args, workload, progress=not args.json)
    if args.json:
        return {**result.to_dict(), "findings": findings.to_dict()}
    from IPython.display import display

    display(result)
    if findings.findings:
        display(findings)
    return None
