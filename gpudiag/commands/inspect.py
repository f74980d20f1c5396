"""Report the host, the GPUs, the driver and torch (or a recorded machine with --replay)."""

from __future__ import annotations

import argparse
import json

from gpudiag.probe.system import SystemReport, inspect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (a snapshot)")
    parser.add_argument(
        "--replay",
        metavar="FILE",
        help="report a recorded machine: `nvidia-smi -q -x` XML, `nvidia-smi -q` or `nvidia-smi` "
        "text, or a gpudiag JSON snapshot",
    )
    parser.add_argument(
        "--topology",
        metavar="FILE",
        action="append",
        help="how the recorded GPUs connect: `nvidia-smi topo -m` output (repeat the option to "
        "add `nvidia-smi topo -p2p r` output of the same machine)",
    )


def system_report(args: argparse.Namespace) -> SystemReport:
    """The report the arguments ask for: this machine, or the recorded one."""
    return inspect(replay=args.replay, topology=args.topology or None)


def run(args: argparse.Namespace) -> int:
    """The terminal's ``gpudiag inspect``: the report as text, or as JSON with ``--json``."""
    report = system_report(args)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report)
    return 0
