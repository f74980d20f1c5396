"""Start the live monitor: GPUs (the host when there is none); --replay FILE plays a recording."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.devices import parse_devices
from gpudiag.monitoring import Monitor, monitor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=float, default=0.1, metavar="S", help="seconds between samples (0.1)"
    )
    parser.add_argument(
        "--replay",
        metavar="FILE",
        help="play a recording at real speed: a session from Monitor.save, an `nvidia-smi -q -x` "
        "dump, a gpudiag snapshot, or 'demo'",
    )
    parser.add_argument(
        "--exporter",
        action="append",
        metavar="URL",
        help="a dcgm-exporter /metrics URL; repeat it to watch a cluster's GPUs",
    )
    parser.add_argument(
        "--devices", metavar="LIST", help="comma-separated NVML indices or UUIDs (default: all)"
    )
    parser.add_argument(
        "--history", type=float, default=600.0, metavar="S", help="seconds kept in memory (600)"
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Monitor:
    # In a notebook the widget is shown by monitor(); the returned Monitor does not show it
    # twice (Monitor._ipython_display_ knows it was shown in this cell).
    return monitor(
        interval=args.interval,
        devices=parse_devices(args.devices),
        replay=args.replay,
        exporters=args.exporter,
        history_s=args.history,
    )
