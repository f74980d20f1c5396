"""Every rank's evidence in one report: run as `torchrun --nproc-per-node=N -m gpudiag doctor`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpudiag.commands.bench import byte_size
from gpudiag.errors import GpuDiagError

# The demo GPT at a sequence length that steps in well under a second on a laptop CPU.
DEFAULT_OVERRIDES: dict[str, dict[str, Any]] = {"gpt": {"seq_len": 256}}


def _override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r} (e.g. seq_len=512)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document with a ranks list")
    parser.add_argument(
        "--workload",
        default="gpt",
        help="a demo workload (gpt, mlp, cnn, input_bound) or package.module:function "
        "returning a gd.Workload, rebuilt on every rank (default: gpt)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        type=_override,
        action="append",
        default=None,
        help="a workload parameter, repeatable (default for gpt: seq_len=256)",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per rank (default 5)")
    parser.add_argument("--no-profile", action="store_true", help="skip the one profiled step")
    parser.add_argument(
        "--no-collective", action="store_true", help="skip the all-reduce measurement"
    )
    parser.add_argument(
        "--sizes", nargs="+", type=byte_size, default=None, help="all-reduce sizes (64K style)"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        help="a rank this much slower than the others is a straggler (default 0.10)",
    )


def run(args: argparse.Namespace) -> int:
    from gpudiag.distributed.run import doctor

    if args.steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    if not 0 < args.threshold < 10:
        raise GpuDiagError(f"--threshold is a fraction such as 0.10 (10 %), got {args.threshold}")
    overrides = dict(args.overrides) if args.overrides else DEFAULT_OVERRIDES.get(args.workload)
    report = doctor(
        workload=args.workload,
        overrides=overrides,
        steps=args.steps,
        profile=not args.no_profile,
        collective=not args.no_collective,
        sizes=args.sizes,
        threshold=args.threshold,
    )
    if report is None:  # not rank 0: rank 0 prints the merged report
        return 0
    print(json.dumps(report.to_dict(), indent=2) if args.json else repr(report))
    return 1 if any(r.error for r in report.ranks) else 0
