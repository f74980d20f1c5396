"""Occupancy of a kernel launch, with sliders and a plot against block size (or --no-widget)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpudiag.analysis.occupancy import carveout_config_bytes
from gpudiag.commands.occupancy import add_arguments as _add_cli_arguments
from gpudiag.commands.occupancy import answer, question


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_cli_arguments(parser)
    parser.add_argument(
        "--no-widget", action="store_true", help="show the result only, without sliders and plot"
    )


def _load_plot_library() -> None:
    """Import plotly's widget figure with a bar: the first import takes seconds (2.6 s of
    ``plotly.graph_objs.FigureWidget`` alone on a 2-core machine; the rest of plotly 0.1 s)."""
    if "plotly.basewidget" in sys.modules:  # FigureWidget's module, loaded on first access
        return
    from gpudiag._progress import ProgressBar, finish, report

    bar = ProgressBar("occupancy")
    report(bar, "loading plotly (first use only)", 0, 1)
    from plotly.graph_objs import FigureWidget  # noqa: F401  (cached for every later call)

    finish(bar, "loading plotly (first use only)")


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    q = question(args)
    occ, _ = answer(q)  # validates the inputs before any widget is built
    if args.no_widget or args.json:
        return occ.to_dict() if args.json else occ
    _load_plot_library()
    from gpudiag.ui.occupancy import occupancy_explorer

    carveout = q.carveout_kib
    if q.carveout_percent is not None and q.carveout_percent >= 0:
        # The widget offers the configurations themselves; show the one the percentage gives.
        carveout = carveout_config_bytes(occ.cc, carveout_percent=q.carveout_percent) // 1024
    return occupancy_explorer(
        occ.cc,
        q.threads,
        q.regs,
        q.static_smem + q.dynamic_smem,
        carveout_kib=carveout,
        barriers_per_block=q.barriers,
    )
