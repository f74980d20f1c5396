"""Diagnose a run: rules over the system, a trace or a demo workload -> ranked findings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpudiag.errors import GpuDiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="T",
        action="append",
        default=[],
        help="a torch.profiler / Kineto trace (.json or .json.gz); repeat for one file per rank",
    )
    parser.add_argument(
        "--replay", metavar="FILE", help="diagnose a recorded machine (`nvidia-smi -q -x` XML)"
    )
    parser.add_argument(
        "--topology",
        metavar="FILE",
        action="append",
        help="with --replay: the machine's `nvidia-smi topo -m` (and `topo -p2p r`) output",
    )
    parser.add_argument(
        "--workload",
        metavar="NAME",
        help="profile a demo workload (gpt, mlp, cnn, input_bound) for a few steps",
    )
    parser.add_argument("--steps", type=int, default=3, help="profiled steps of --workload (3)")
    parser.add_argument(
        "--no-scaling",
        action="store_true",
        help="skip timing the workload at 4x its batch (the per-step overhead rule)",
    )
    parser.add_argument("--code", metavar="FILE", help="a Python file to scan for API misuse")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def run(args: argparse.Namespace) -> int:
    from gpudiag.doctor import diagnose
    from gpudiag.probe.system import inspect

    trace = None
    if args.trace:
        from gpudiag.analysis.trace import analyze_trace

        trace = analyze_trace(args.trace[0] if len(args.trace) == 1 else args.trace)
    code = None
    if args.code:
        try:
            code = Path(args.code).read_text(encoding="utf-8")
        except OSError as exc:
            raise GpuDiagError(f"cannot read --code {args.code}: {exc.strerror}") from exc
    if args.steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    system = inspect(replay=args.replay, topology=args.topology or None)
    from gpudiag._progress import ProgressBar

    with ProgressBar("diagnose", enabled=not args.json) as bar:
        diagnosis = diagnose(
            workload=args.workload,
            trace=trace,
            system=system,
            code=code,
            steps=args.steps,
            scaling=not args.no_scaling,
            progress=bar,
        )
    if args.json:
        print(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        print(diagnosis)
    return 0
