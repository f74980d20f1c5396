"""Measure hardware ceilings: matmul, bandwidth, attention, allreduce; or read nccl-tests logs."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.bench import add_arguments, benchmark_list, measure, multinode_command

__all__ = ["add_arguments", "run_cell"]


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    if args.bench is None:
        print(benchmark_list("%gpudiag bench"))
        return None
    command = multinode_command(args)
    if command is not None and args.print_command:
        print(command)
        return None
    result = measure(args, progress=not args.json)
    if command is not None:
        print(f"On several nodes, run on each node (rank 0 prints the result):\n  {command}")
    if args.plot:
        result.plot().write_html(args.plot)
    return result.to_dict() if args.json else result
