"""Tune your training step: the cell (%%) or a Workload / demo (%): the best measured fixes.

``%%gpudiag tune --budget 120`` runs the cell as one training step, the way ``%%gpudiag
compare`` does: it is diagnosed, then the fixes the evidence points to are raced, their
winners combined and measured together, within the budget. The torch modules and optimizers
the cell uses are restored afterwards, and so are the notebook variables it assigns; the
cell's printed output is silenced while it is measured.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.tune import add_search_arguments, finish, run_search


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
    from gpudiag.magics.compare import measure_cell

    result = measure_cell(
        args,
        cell,
        shell,
        lambda workload: run_search(workload, args, progress=not args.json),
        magic="tune",
        usage="use %%gpudiag tune as a cell magic (the cell is the step), or "
        "%gpudiag tune --workload NAME with a gd.Workload variable or a demo name",
    )
    finish(result, args)
    return result.to_dict() if args.json else result
