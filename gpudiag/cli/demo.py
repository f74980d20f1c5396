"""Show what gpudiag does on this machine and on a recorded A100, using built-in workloads."""

from __future__ import annotations

import argparse

from gpudiag.data import A100_MIG, recording
from gpudiag.probe.system import inspect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="only the reports, no experiments")


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def run(args: argparse.Namespace) -> int:
    _section("This machine (live)")
    print(inspect())
    _section("A recorded machine: NVIDIA A100-SXM4-80GB with MIG (replay)")
    print(inspect(replay=recording(A100_MIG)))
    return 0
