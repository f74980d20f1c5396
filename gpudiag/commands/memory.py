"""Memory of a training step: estimate, measure, explain an out-of-memory, find what fits.

gpudiag memory gpt --set seq_len=512 --batch-size 8      # estimate + measured step
gpudiag memory gpt --budget 512MiB --fit                  # largest micro-batch, what-ifs
gpudiag memory --config config.json --seq-len 4096        # a transformer config (formula)
gpudiag memory --snapshot oom_snapshot.pickle             # a torch.cuda memory snapshot
gpudiag memory --snapshot snapshots/                      # per-rank snapshots: who holds more
gpudiag memory --diff step10.pickle step20.pickle         # what grew between two snapshots
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any

from gpudiag._files import CONFIG_BYTES, read_json
from gpudiag._values import arg_float, arg_int
from gpudiag.commands.compare import add_step_timeout, parse_overrides, with_step_timeout
from gpudiag.errors import ArgumentError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workload", nargs="?", default=None, help="a demo workload: gpt, mlp, cnn (default gpt)"
    )
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="change the demo")
    parser.add_argument(
        "--batch-size",
        type=arg_int(1, 1 << 30),
        default=None,
        help="sequences (or samples) per step (default: 1 with --config, else the demo's)",
    )
    parser.add_argument("--seq-len", type=arg_int(1, 1 << 30), default=None, help="with --config")
    parser.add_argument("--precision", default=None, help="fp32, bf16 or fp16")
    parser.add_argument("--optimizer", default=None, help="adamw, adam, sgd, sgd_momentum, ...")
    parser.add_argument(
        "--checkpointing", action="store_true", help="with activation checkpointing"
    )
    parser.add_argument("--parallelism", default=None, help="e.g. fsdp:8, ddp:4,tp:2")
    parser.add_argument("--budget", default=None, help="memory cap, e.g. 512MiB or 8GiB")
    parser.add_argument("--fit", action="store_true", help="largest micro-batch + what-ifs")
    parser.add_argument(
        "--estimate-only", action="store_true", help="estimate without running the step"
    )
    parser.add_argument("--config", default=None, help="a transformer config (JSON file)")
    parser.add_argument(
        "--inference", action="store_true", help="with --config: generation, with KV cache"
    )
    parser.add_argument(
        "--snapshot",
        default=None,
        help="a _dump_snapshot() pickle to explain, or a folder of one per rank",
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        default=None,
        metavar=("BEFORE", "AFTER"),
        help="two _dump_snapshot() pickles: what changed from the first to the second",
    )
    parser.add_argument(
        "--by-function",
        action="store_true",
        help="with --diff: match allocation stacks without line numbers (two code versions)",
    )
    parser.add_argument(
        "--max-memory-gb",
        type=arg_float(),
        default=None,
        help="memory a snapshot read may take, in GiB (default: half of this machine's)",
    )
    add_step_timeout(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def compute(
    args: argparse.Namespace, workload: Any = None, *, progress: bool = True
) -> tuple[Any, Any]:
    """(the result object, its findings) for the arguments; ``workload`` overrides the demo.
    ``progress``: bars over the steps that run (estimate, measured steps, fit)."""
    from gpudiag.rules.memory import memory_findings

    if args.snapshot or args.diff:
        return _snapshots(args)
    from gpudiag.experiment.estimate import estimate_memory

    if args.config:
        config = read_json(args.config, "config", max_bytes=CONFIG_BYTES)
        est = estimate_memory(
            config,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            precision=args.precision,
            optimizer=args.optimizer,
            checkpointing=args.checkpointing or None,
            parallelism=args.parallelism,
            training=not args.inference,
        )
        from gpudiag.experiment.memory_report import parse_budget

        return est, memory_findings(estimate=est, budget_bytes=parse_budget(args.budget))
    if workload is None:
        from gpudiag import workloads

        workload = workloads.get(args.workload or "gpt", **parse_overrides(args.set))
    workload = with_step_timeout(workload, args.step_timeout)
    if args.batch_size is not None:
        workload = copy.copy(workload)  # the user's workload keeps its batch size
        workload.batch_size = int(args.batch_size)
    if args.fit:
        from gpudiag.experiment.fit import fit

        result = fit(workload, args.budget, progress=progress)
        return result, memory_findings(fit=result)
    if args.estimate_only:
        est = estimate_memory(
            workload,
            precision=args.precision,
            optimizer=args.optimizer,
            checkpointing=args.checkpointing or None,
            parallelism=args.parallelism,
            progress=progress,
        )
        from gpudiag.experiment.memory_report import parse_budget

        return est, memory_findings(estimate=est, budget_bytes=parse_budget(args.budget))
    from gpudiag.experiment.estimate import memory_fixes
    from gpudiag.experiment.memory_report import memory

    report = memory(
        workload,
        fixes=memory_fixes(args.precision, args.checkpointing),
        budget=args.budget,
        progress=progress,
    )
    return report, memory_findings(report=report)


def _snapshots(args: argparse.Namespace) -> tuple[Any, Any]:
    """A snapshot explained, a folder of ranks compared, or two snapshots diffed."""
    from gpudiag.analysis.files import GiB
    from gpudiag.analysis.memory_snapshot import MemorySnapshot, analyze_memory_snapshot
    from gpudiag.rules.memory import memory_findings

    max_memory = None
    if args.max_memory_gb is not None:
        if not 0 < args.max_memory_gb < 1 << 20:
            raise ArgumentError(f"--max-memory-gb {args.max_memory_gb}: give a size above 0 GiB.")
        max_memory = int(args.max_memory_gb * GiB)
    if args.diff:
        if args.snapshot:
            raise ArgumentError("give --snapshot FILE or --diff BEFORE AFTER, not both")
        before, after = (analyze_memory_snapshot(p, max_memory=max_memory) for p in args.diff)
        if not isinstance(before, MemorySnapshot) or not isinstance(after, MemorySnapshot):
            raise ArgumentError("--diff compares two snapshot files, not folders")
        diff = before.diff(after, by="function" if args.by_function else "stack")
        return diff, memory_findings(snapshot=after)
    snap = analyze_memory_snapshot(args.snapshot, max_memory=max_memory)
    if isinstance(snap, MemorySnapshot):
        return snap, memory_findings(snapshot=snap)
    # A folder of ranks: the rules read the rank that holds the most (where an OOM comes first).
    return snap, memory_findings(snapshot=snap.rank(snap.heaviest_rank))


def run(args: argparse.Namespace) -> int:
    result, findings = compute(args, progress=not args.json and sys.stderr.isatty())
    if args.json:
        print(json.dumps({**result.to_dict(), "findings": findings.to_dict()}, indent=2))
    else:
        print(repr(result))
        for finding in findings.findings:
            print("\n".join(finding.lines()))
    return 0
