"""Compare a demo workload before/after fixes: speedup with CI, verdict, memory, drift."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpudiag._values import arg_float, arg_int
from gpudiag.errors import GpuDiagError

if TYPE_CHECKING:
    from gpudiag.experiment.comparison import Comparison
    from gpudiag.fixes import Fix
    from gpudiag.step import Workload


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["seq_len=2048", "attn_implementation=sdpa"]`` -> {"seq_len": 2048, ...}; values
    read as fix parameters are (gpudiag.fixes.parse_value: true/yes/on, none, numbers)."""
    from gpudiag.fixes import parse_value

    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise GpuDiagError(f"--set takes key=value (like seq_len=2048), got {item!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


def add_protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the terminal command and the notebook magic."""
    parser.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="FIX",
        help="a fix to try, e.g. precision.bf16, attention.backend=flash, "
        "compile:mode=max-autotune "
        "(repeat for several; a+b tries them together)",
    )
    parser.add_argument("--combine", action="store_true", help="also try all fixes together")
    parser.add_argument(
        "--budget",
        type=arg_float(0, 86_400, low_open=True),
        default=60.0,
        metavar="S",
        help="time budget for the timed rounds (s)",
    )
    parser.add_argument(
        "--min-rounds",
        type=arg_int(2, 100_000),
        default=5,
        help="rounds before a verdict may stop (%(default)s)",
    )
    parser.add_argument(
        "--max-rounds",
        type=arg_int(2, 100_000),
        default=100,
        help="rounds at most per arm (%(default)s)",
    )
    parser.add_argument(
        "--fixed", action="store_true", help="no adaptive stopping: run exactly --max-rounds rounds"
    )
    parser.add_argument(
        "--seed",
        type=arg_int(0, 2**32 - 1),
        default=0,
        help="seeds the round order and the inputs (%(default)s)",
    )
    add_step_timeout(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--recipe", metavar="FILE", help="save the fixes that helped as a recipe (.yaml or .json)"
    )
    parser.add_argument("--plot", metavar="FILE.html", help="save the figure as HTML")


def add_step_timeout(parser: argparse.ArgumentParser) -> None:
    """``--step-timeout S``: how long one step may run before the trial stops it."""
    parser.add_argument(
        "--step-timeout",
        type=arg_float(0, low_open=True),
        default=None,
        metavar="S",
        help="seconds one training step may run before it is stopped as hung (default: an "
        "arm's first step 300 s, later steps 10x the first, at least 30 s)",
    )


def with_step_timeout(workload: Workload, seconds: float | None) -> Workload:
    """``workload`` with its step limit set to ``seconds`` (a copy; None: as it is)."""
    if seconds is None:
        return workload
    import copy

    limited = copy.copy(workload)
    limited.step_timeout_s = seconds
    return limited


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", default="gpt", help="demo workload: gpt, mlp, cnn or input_bound"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change the demo workload, e.g. --set seq_len=2048",
    )
    parser.add_argument(
        "--threads", type=arg_int(1, 4096), help="torch threads for the run (torch.set_num_threads)"
    )
    add_protocol_arguments(parser)


def arm_specs(fixes: list[str]) -> list[Fix | list[Fix]]:
    """``a+b`` is one arm with both fixes."""
    from gpudiag.fixes import Fix

    out: list[Fix | list[Fix]] = []
    for text in fixes:
        parts = [p for p in text.split("+") if p.strip()]
        out.append([Fix.parse(p) for p in parts] if len(parts) > 1 else Fix.parse(text))
    return out


def run_comparison(workload: Workload, args: argparse.Namespace, *, progress: bool) -> Comparison:
    from gpudiag.experiment.compare import compare

    if not args.fix:
        raise GpuDiagError(
            "give at least one --fix (e.g. --fix precision.bf16 --fix attention.backend=flash)"
        )
    return compare(
        with_step_timeout(workload, args.step_timeout),
        arm_specs(args.fix),
        combine=args.combine,
        time_budget_s=args.budget,
        adaptive=not args.fixed,
        min_rounds=args.min_rounds,
        max_rounds=args.max_rounds,
        seed=args.seed,
        progress=progress,
    )


def finish(result: Comparison, args: argparse.Namespace) -> None:
    if args.recipe:
        path = result.recipe().save(args.recipe)
        if not args.json:
            print(f"recipe saved to {path}")
    if args.plot:
        result.plot().write_html(args.plot)
        if not args.json:
            print(f"figure saved to {args.plot}")


def measure_demo(
    args: argparse.Namespace,
    measure: Callable[[Workload], Any],
    finish: Callable[[Any, argparse.Namespace], None],
) -> int:
    """A measuring command in the terminal: the demo workload ``--workload`` (changed by
    ``--set``, on ``--threads``), measured, printed as text or ``--json``, then ``finish``
    (the files it saves)."""
    from gpudiag import workloads

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = measure(workloads.get(args.workload, **parse_overrides(args.set)))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
    finish(result, args)
    return 0


def run(args: argparse.Namespace) -> int:
    return measure_demo(args, lambda wl: run_comparison(wl, args, progress=not args.json), finish)
