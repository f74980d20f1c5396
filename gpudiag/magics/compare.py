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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpudiag.commands.compare import add_protocol_arguments, finish, parse_overrides, run_comparison
from gpudiag.errors import GpuDiagError

if TYPE_CHECKING:
    from gpudiag.step import Workload


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
) -> tuple[Workload, set[str]]:
    """A step-function workload that runs the cell; its modules and optimizers are protected.

    ``each_run_restored``: every run of the cell puts the notebook's variables back and keeps
    its printed output to itself (for a workload that outlives the magic call, such as the one
    a doctor card's Try-it button runs later).
    """
    from gpudiag.step import Workload

    code = compile_cell(cell, f"<%%gpudiag {magic} cell>")
    names = _names(code)
    modules, optimizers = _torch_objects(names, namespace)

    def exec_cell() -> Any:
        exec(code, namespace)  # the user's own cell, in their own namespace
        return namespace.get("loss")

    def step() -> Any:
        if not each_run_restored:
            return exec_cell()
        with _bindings_restored(names, namespace), contextlib.redirect_stdout(io.StringIO()):
            return exec_cell()

    # The biggest module is "the model": reset between arms, its gradients give the grad norm.
    model = max(modules, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
    workload = Workload.from_step(
        step, model=model, optimizer=optimizers[0] if optimizers else None, name="cell"
    )
    workload.protected = tuple(modules + optimizers)
    return workload, names


def measure_cell(
    args: argparse.Namespace,
    cell: str | None,
    shell: Any,
    measure: Callable[[Workload], Any],
    *,
    magic: str,
    usage: str,
) -> Any:
    """The workload of a measuring magic, measured: the cell as the step (``%%``; its output
    silenced, the notebook's bindings restored), else ``--workload NAME`` (a gd.Workload
    variable of the notebook or a demo workload); ``usage`` is the error without either."""
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    if cell is not None and cell.strip():
        workload, names = cell_workload(cell, namespace, magic=magic)
        # Cell output is silenced while it runs dozens of times; the progress bar stays.
        with _bindings_restored(names, namespace), contextlib.redirect_stdout(io.StringIO()):
            return measure(workload)
    if not args.workload:
        raise GpuDiagError(usage)
    from gpudiag.step import Workload

    value = namespace.get(args.workload)
    if isinstance(value, Workload):
        return measure(value)
    from gpudiag import workloads

    return measure(workloads.get(args.workload, **parse_overrides(args.set)))


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    result = measure_cell(
        args,
        cell,
        shell,
        lambda workload: run_comparison(workload, args, progress=not args.json),
        magic="compare",
        usage="use %%gpudiag compare --fix ... as a cell magic (the cell is the step), or "
        "%gpudiag compare --workload NAME --fix ... with a gd.Workload variable or a demo name",
    )
    finish(result, args)
    return result.to_dict() if args.json else result
