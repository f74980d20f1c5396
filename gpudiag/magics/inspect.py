"""Report the host, the GPUs, the driver and torch (``--replay FILE`` for a recorded machine,
``--topology FILE`` for its ``nvidia-smi topo -m`` / ``topo -p2p r`` output)."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.inspect import add_arguments, system_report

__all__ = ["add_arguments", "run_cell"]


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    """The report (its card in the notebook), or its dict with ``--json``."""
    report = system_report(args)
    return report.to_dict() if args.json else report
