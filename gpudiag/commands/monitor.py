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
        default=None,
        metavar="S",
        help="seconds between samples (0.1 here, 1 for a cluster)",
    )
    parser.add_argument(
        "--replay",
        metavar="FILE",
        help="play a recording at real speed: a session from Monitor.save, an `nvidia-smi -q -x` "
        "dump, a gpudiag snapshot, or 'demo'",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus server that scrapes dcgm-exporter on every node (http://HOST:9090)",
    )
    parser.add_argument(
        "--selector",
        default="",
        metavar="MATCHERS",
        help="""the label matchers of the DCGM series on that server ('{job="dcgm"}')""",
    )
    parser.add_argument(
        "--exporter",
        "--endpoint",
        dest="exporter",
        action="append",
        metavar="URL",
        help="a dcgm-exporter /metrics URL read directly; repeat it to watch a cluster's GPUs",
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
        prometheus=args.prometheus,
        selector=args.selector,
        endpoints=args.exporter,
        **options,
    )
