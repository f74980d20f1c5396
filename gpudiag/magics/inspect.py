"""Report the host, the GPUs, the driver and torch (``--replay FILE`` for a recorded machine,
``--topology FILE`` for its ``nvidia-smi topo -m`` / ``topo -p2p r`` output)."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.probe.system import SystemReport, inspect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replay", metavar="FILE", help="nvidia-smi -q -x XML or a gpudiag snapshot"
    )
    parser.add_argument(
        "--topology",
        metavar="FILE",
        action="append",
        help="the recorded machine's `nvidia-smi topo -m` output (repeat for `topo -p2p r`)",
    )


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> SystemReport:
    return inspect(replay=args.replay, topology=args.topology or None)
