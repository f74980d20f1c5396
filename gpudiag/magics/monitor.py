"""Start the live monitor: GPUs (the host when there is none); --replay FILE plays a recording."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag._values import arg_float
from gpudiag.commands.monitor import add_arguments as _add_shared_arguments
from gpudiag.commands.monitor import start
from gpudiag.monitoring import Monitor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_shared_arguments(parser)
    parser.add_argument(
        "--history",
        type=arg_float(),
        default=600.0,
        metavar="S",
        help="seconds kept in memory (600)",
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Monitor:
    # In a notebook the widget is shown by monitor(); the returned Monitor does not show it
    # twice (Monitor._ipython_display_ knows it was shown in this cell).
    return start(args, history_s=args.history)
