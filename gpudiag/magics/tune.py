"""Tune your training step: the cell (%%) or a Workload / demo (%): the best measured fixes.

``%%gpudiag tune --budget 120`` runs the cell as one training step, the way ``%%gpudiag
compare`` does: it is diagnosed, then the fixes the evidence points to are raced, their
winners combined and measured together, within the budget. The torch modules and optimizers
the cell uses are restored afterwards, and so are the notebook variables it assigns; the
cell's printed output is silenced while it is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from gpudiag.commands.compare import parse_overrides
from gpudiag.commands.tune import add_search_arguments, finish, run_search
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
    add_search_arguments(parser)


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    from gpudiag.magics.compare import _bindings_restored, cell_workload

    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    if cell is not None and cell.strip():
        workload, names = cell_workload(cell, namespace, magic="tune")
        with _bindings_restored(names, namespace), contextlib.redirect_stdout(io.StringIO()):
            result = run_search(workload, args, progress=not args.json)
    else:
        if not args.workload:
            raise GpuDiagError(
                "use %%gpudiag tune as a cell magic (the cell is the step), or "
                "%gpudiag tune --workload NAME with a gd.Workload variable or a demo name"
            )
        from gpudiag.step import Workload

        value = namespace.get(args.workload)
        if isinstance(value, Workload):
            workload = value
        else:
            from gpudiag import workloads

            workload = workloads.get(args.workload, **parse_overrides(args.set))
        result = run_search(workload, args, progress=not args.json)
    finish(result, args)
    return result.to_dict() if args.json else result
