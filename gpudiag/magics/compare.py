"""Compare before/after fixes: the cell as the workload (%%), or a Workload / demo workload (%).

``%%gpudiag compare --fix precision.bf16 --fix attention.backend=flash`` runs the cell as one
training step, many times, with each fix applied around it (ambient fixes and compile). The
torch modules and optimizers the cell uses are restored afterwards, and so are the notebook
variables it assigns; a ``loss`` variable set by the cell feeds the drift check. The cell's
printed output is silenced while it is measured. The result shows its figure above its table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import types
from collections.abc import Iterator
from typing import Any

from gpudiag.commands.compare import add_protocol_arguments, finish, parse_overrides, run_comparison
from gpudiag.errors import GpuDiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        metavar="NAME",
        help="line form: a gd.Workload variable of the notebook, or a demo workload "
        "(gpt, mlp, cnn, input_bound)",
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="change the demo workload"
    )
    add_protocol_arguments(parser)


def compile_cell(cell: str, filename: str) -> types.CodeType:
    """The cell as code; a cell that does not compile is a GpuDiagError with its line (the
    magic never runs a cell it cannot read, and never raises Python's SyntaxError at you)."""
    try:
        return compile(cell, filename, "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the cell
        where = f" on line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise GpuDiagError(
            f"the cell does not compile ({type(exc).__name__}{where}: {message}): fix it and "
            "run it as a plain cell first"
        ) from None


def _names(code: types.CodeType) -> set[str]:
    """Every global name the code (and the functions it defines) reads or writes."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _torch_objects(names: set[str], namespace: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    import torch

    modules, optimizers = [], []
    for name in sorted(names):
        value = namespace.get(name)
        if isinstance(value, torch.nn.Module):
            modules.append(value)
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
    return modules, optimizers


@contextlib.contextmanager
def _bindings_restored(names: set[str], namespace: dict[str, Any]) -> Iterator[None]:
    """The notebook's variables the cell rebinds are put back; names it creates are removed."""
    saved = {n: namespace[n] for n in names if n in namespace}
    try:
        yield
    finally:
        for name in names:
            if name in saved:
                namespace[name] = saved[name]
            else:
                namespace.pop(name, None)


def cell_workload(
    cell: str, namespace: dict[str, Any], *, each_run_restored: bool = False, magic: str = "compare"
) -> tuple[Any, set[str]]:
    """A step-function workload that runs the cell; its modules and optimizers are protected.

    ``each_run_restored``: every run of the cell puts the notebook's variables back and keeps
    its printed output to itself (for a workload that outlives the magic call, such as the one
    a doctor card's Try-it button runs later).
    """
    from gpudiag.experiment.workload import Workload

    code = compile_cell(cell, f"<%%gpudiag {magic} cell>")
    names = _names(code)
    modules, optimizers = _torch_objects(names, namespace)

    def run_cell() -> Any:
        exec(code, namespace)  # the user's own cell, in their own namespace
        return namespace.get("loss")

    def step() -> Any:
        if not each_run_restored:
            return run_cell()
        with _bindings_restored(names, namespace), contextlib.redirect_stdout(io.StringIO()):
            return run_cell()

    # The biggest module is "the model": reset between arms, its gradients give the grad norm.
    model = max(modules, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
    workload = Workload.from_step(
        step, model=model, optimizer=optimizers[0] if optimizers else None, name="cell"
    )
    workload.protected = tuple(modules + optimizers)
    return workload, names


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    if cell is not None and cell.strip():
        workload, names = cell_workload(cell, namespace)
        # Cell output is silenced while it runs dozens of times; the progress bar stays.
        with _bindings_restored(names, namespace), contextlib.redirect_stdout(io.StringIO()):
            result = run_comparison(workload, args, progress=not args.json)
    else:
        if not args.workload:
            raise GpuDiagError(
                "use %%gpudiag compare --fix ... as a cell magic (the cell is the step), or "
                "%gpudiag compare --workload NAME --fix ... with a gd.Workload variable or a "
                "demo name"
            )
        from gpudiag.experiment.workload import Workload

        value = namespace.get(args.workload)
        if isinstance(value, Workload):
            workload = value
        else:
            from gpudiag import workloads

            workload = workloads.get(args.workload, **parse_overrides(args.set))
        result = run_comparison(workload, args, progress=not args.json)
    finish(result, args)
    return result.to_dict() if args.json else result
