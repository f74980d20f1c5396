"""Start the monitor on the GPUs (the host when there is none); --replay plays a recording."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag._values import arg_float
from gpudiag.commands.devices import parse_devices
from gpudiag.monitoring import Monitor, monitor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both front ends take; each adds its own (the terminal's redraws, the
    notebook's history)."""
    parser.add_argument(
        "--interval",
        type=arg_float(),
        default=0.1,
        metavar="S",
        help="seconds between samples (0.1)",
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


def start(args: argparse.Namespace, **options: Any) -> Monitor:
    """The running monitor the arguments ask for; ``options`` go to ``gd.monitor``."""
    return monitor(
        interval=args.interval,
        devices=parse_devices(args.devices),
        replay=args.replay,
        exporters=args.exporter,
        **options,
    )
