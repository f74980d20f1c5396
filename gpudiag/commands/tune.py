"""Search the fixes the diagnosis points to for the fastest measured combination, in a budget."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpudiag._values import arg_float, arg_int
from gpudiag.commands.compare import add_step_timeout, measure_demo, with_step_timeout


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the terminal command and the notebook magic."""
    parser.add_argument(
        "--fix",
        action="append",
        default=None,
        metavar="FIX",
        help="a candidate instead of the diagnosis' (repeat; an id without values, like "
        "batch.size, is expanded into the values worth trying)",
    )
    parser.add_argument(
        "--budget",
        type=arg_float(0, 86_400, low_open=True),
        default=600.0,
        metavar="S",
        help="seconds for the whole search, the diagnosis included (%(default)s)",
    )
    parser.add_argument(
        "--memory-budget", metavar="BYTES", help="e.g. 8GiB: batch sizes and arms over it are out"
    )
    parser.add_argument(
        "--no-diagnosis",
        action="store_true",
        help="skip gd.diagnose (candidates from the workload and --fix only)",
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
        "--recipe", metavar="FILE", help="save the best arm's fixes as a recipe (.yaml or .json)"
    )
    parser.add_argument("--plot", metavar="FILE.html", help="save the figure as HTML")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", default="gpt", help="demo workload: gpt, mlp, cnn or input_bound"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change the demo workload, e.g. --set batch_size=4",
    )
    parser.add_argument(
        "--threads", type=arg_int(1, 4096), help="torch threads for the run (torch.set_num_threads)"
    )
    add_search_arguments(parser)


def run_search(workload: Any, args: argparse.Namespace, *, progress: bool) -> Any:
    from gpudiag.fixes import Fix
    from gpudiag.tune import tune

    return tune(
        with_step_timeout(workload, args.step_timeout),
        time_budget_s=args.budget,
        memory_budget=args.memory_budget,
        fixes=[Fix.parse(text) for text in args.fix] if args.fix else None,
        diagnosis=not args.no_diagnosis,
        seed=args.seed,
        progress=progress,
    )


def finish(result: Any, args: argparse.Namespace) -> None:
    if args.recipe:
        if result.best.is_baseline:
            print(f"no recipe saved: {result.summary()}", file=sys.stderr)
        else:
            path = result.recipe().save(args.recipe)
            if not args.json:
                print(f"recipe saved to {path}")
    if args.plot:
        result.plot().write_html(args.plot)
        if not args.json:
            print(f"figure saved to {args.plot}")


def run(args: argparse.Namespace) -> int:
    return measure_demo(args, lambda wl: run_search(wl, args, progress=not args.json), finish)
