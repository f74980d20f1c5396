"""Stop the live monitor (from %gpudiag monitor or gd.monitor()) and show its summary."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.monitoring import MonitorSummary, active


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> MonitorSummary | None:
    m = active()
    if m is None:
        print("gpudiag: no monitor is running (start one with %gpudiag monitor)")
        return None
    m.stop()
    return m.summary()
