"""Analyse torch.profiler / Kineto traces: the time ledger, kernels, syncs, per rank."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpudiag._values import arg_float, arg_int
from gpudiag.analysis.files import GiB
from gpudiag.analysis.trace import analyze_trace
from gpudiag.errors import ArgumentError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="trace files (.json / .json.gz), one per rank"
    )
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument(
        "--top", type=arg_int(0, 100_000), default=10, help="kernels and CPU operators to list"
    )
    parser.add_argument(
        "--max-gb",
        type=arg_float(),
        default=None,
        help="the most JSON text to read from one file, in GiB (default 64: a runaway file stops)",
    )
    parser.add_argument(
        "--workers",
        type=arg_int(),
        default=None,
        help="ranks analysed at once in separate processes (default: one per core, big traces)",
    )
    parser.add_argument(
        "--include-last-step",
        action="store_true",
        help="keep the last ProfilerStep in the aggregates (left out by default, as HTA does)",
    )


def run(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {"include_last_step": args.include_last_step}
    if args.max_gb is not None:
        if not 0 < args.max_gb < 1 << 20:
            raise ArgumentError(f"--max-gb {args.max_gb}: give a size above 0 GiB.")
        options["max_bytes"] = int(args.max_gb * GiB)
    report = analyze_trace(
        args.files,
        workers=args.workers,
        progress=not args.json and sys.stderr.isatty(),
        **options,
    )
    if args.json:
        data = report.to_dict()  # its "ledger" is where the time goes, row by row
        data["collectives"] = report.collectives().to_dict()
        print(json.dumps(data, indent=2))
        return 0
    if report.has_gpu_events:
        # Where the time goes opens the report: every microsecond of the window on one row.
        print("\n".join(report.ledger().lines()) + "\n")
    print(report)
    kernels = report.top_kernels(args.top)
    if kernels:
        print(f"\nTop {len(kernels)} kernels (of {len(report.kernels())}):")
        print("   share   total ms   count   mean us  TC   occ  name")
        for k in kernels:
            occ = "-" if k.theoretical_occupancy is None else f"{k.theoretical_occupancy:.0%}"
            print(
                f"  {k.share:>6.1%} {k.total_us / 1000:>10.2f} {k.count:>7} {k.mean_us:>9.1f} "
                f"{'yes' if k.tensor_cores else 'no':>3} {occ:>5}  {k.short_name}"
            )
    ops = report.top_cpu_ops(args.top)
    if ops:
        print(f"\nTop {len(ops)} CPU operators:")
        print(f"  {'total ms':>10} {'self ms':>9} {'count':>7}  name")
        for o in ops:
            print(f"  {o.total_us / 1000:>10.2f} {o.self_us / 1000:>9.2f} {o.count:>7}  {o.name}")
    sites = report.sync_sites()
    if sites:
        print("\nSync points:")
        for s in sites[: args.top]:
            print(
                f"  {s.count:>5} x {s.name:<28} {s.total_us / 1000:>8.2f} ms  {s.call_site or '?'}"
            )
    if len(report.comparison) > 1:
        print("\nRanks:")
        for c in report.comparison:
            flag = "  <- straggler" if c.rank in report.stragglers else ""
            print(
                f"  rank {c.rank:>3}: compute {c.compute_us / 1000:>9.2f} ms, exposed "
                f"communication {c.communication_us / 1000:>9.2f} ms, idle "
                f"{c.idle_us / 1000:>9.2f} ms{flag}"
            )
    collectives = report.collectives()
    if collectives.calls:
        print("\nCollectives:")
        print("\n".join(repr(collectives).splitlines()[1:]))
    return 0
