"""Measure hardware ceilings: matmul, memory bandwidth, attention, collectives; parse nccl-tests."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from gpudiag._values import arg_int, whole_number
from gpudiag.errors import ArgumentError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}
COLLECTIVE_COMMANDS = {
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
}


def byte_size(text: str) -> int:
    """'4096', '64K', '1MiB', '1.5G' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 4096, 64K, 1MiB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value > 1 << 50:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a pebibyte: not a buffer size")
    if value < 1 or not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of bytes")
    return int(value)


def matmul_size(text: str) -> int | tuple[int, int, int]:
    """'2048' (square) or '4096x1024x512' (M x N x K)."""
    parts = text.lower().split("x")
    try:
        values = [whole_number(p, "a matmul dimension", low=1, high=1 << 20) for p in parts]
    except ArgumentError:
        raise argparse.ArgumentTypeError(
            f"not a matmul size: {text!r} (e.g. 2048 or 4096x1024x512)"
        ) from None
    if len(values) == 1 and values[0] > 0:
        return values[0]
    if len(values) == 3 and min(values) > 0:
        return (values[0], values[1], values[2])
    raise argparse.ArgumentTypeError(f"not a matmul size: {text!r} (e.g. 2048 or 4096x1024x512)")


def _common(p: argparse.ArgumentParser, *, device: bool = True) -> None:
    if device:
        p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if any)")
        p.add_argument(
            "--repeats", type=arg_int(1, 100_000), default=None, help="timed repetitions per case"
        )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--plot", metavar="HTML", default=None, help="also write the plotly figure to this file"
    )


# Each benchmark and what it measures (the listing shown when none is named).
BENCHMARKS: dict[str, str] = {
    "matmul": "achieved TFLOP/s per dtype vs the peak",
    "bandwidth": "device copy and host<->device GB/s vs transfer size",
    "attention": "SDPA / flash-attn / TE backends: time and memory",
    **{
        name: f"{COLLECTIVE_COMMANDS[name]} bus bandwidth (nccl-tests formulas)"
        for name in ("allreduce", "all_gather", "reduce_scatter")
    },
    "nccl-log": "read nccl-tests output into the same result type",
}


def benchmark_list(prog: str = "gpudiag bench") -> str:
    """What ``bench`` without a benchmark prints: every benchmark and how to ask for help."""
    width = max(map(len, BENCHMARKS))
    lines = [f"{prog} BENCHMARK [options]: name a benchmark", ""]
    lines += [f"  {name:<{width}}  {text}" for name, text in BENCHMARKS.items()]
    lines += ["", f"e.g. {prog} matmul; {prog} BENCHMARK --help for its options"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Not required: without a benchmark, run() lists them instead of an argparse error.
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    p = sub.add_parser("matmul", help=BENCHMARKS["matmul"])
    p.add_argument(
        "--dtypes", nargs="+", default=None, help="fp32 tf32 bf16 fp16 fp8 (default: fast ones)"
    )
    p.add_argument("--sizes", nargs="+", type=matmul_size, default=None, help="N or MxNxK")
    _common(p)
    p = sub.add_parser("bandwidth", help=BENCHMARKS["bandwidth"])
    p.add_argument(
        "--kinds",
        nargs="+",
        default=None,
        help="copy h2d_pinned h2d_pageable d2h_pinned d2h_pageable (default: all)",
    )
    p.add_argument(
        "--sizes", nargs="+", type=byte_size, default=None, help="bytes per buffer (64M style)"
    )
    _common(p)
    p = sub.add_parser("attention", help=BENCHMARKS["attention"])
    p.add_argument(
        "--seq-lens",
        nargs="+",
        type=arg_int(1, 1 << 24),
        default=None,
        help="sequence lengths (default 1024 2048 4096 8192 on a GPU, 512 1024 2048 on a CPU)",
    )
    p.add_argument(
        "--backends", nargs="+", default=None, help="flash efficient cudnn math flash_attn te"
    )
    p.add_argument("--batch", type=arg_int(1, 1 << 20), default=None, help="sequences per call")
    p.add_argument("--heads", type=arg_int(1, 1 << 12), default=None, help="attention heads")
    p.add_argument("--head-dim", type=arg_int(1, 1 << 12), default=None, help="dimension per head")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16")
    p.add_argument("--no-causal", action="store_true", help="full attention instead of causal")
    p.add_argument("--no-backward", action="store_true", help="forward only")
    _common(p)
    for name in ("allreduce", "all_gather", "reduce_scatter"):
        p = sub.add_parser(name, help=BENCHMARKS[name])
        p.add_argument(
            "--sizes", nargs="+", type=byte_size, default=None, help="nccl-tests 'size' in bytes"
        )
        p.add_argument(
            "--nproc",
            type=arg_int(1, 4096),
            default=None,
            help="local processes (default: GPUs, or 2 on CPU)",
        )
        p.add_argument("--backend", choices=("nccl", "gloo"), default=None)
        p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
        p.add_argument("--repeats", type=arg_int(1, 100_000), default=None)
        p.add_argument(
            "--iters", type=arg_int(1, 1_000_000), default=None, help="calls per timed repetition"
        )
        p.add_argument(
            "--nnodes",
            type=arg_int(1, 99_999),
            default=2,
            help="nodes in the printed multi-node command",
        )
        p.add_argument(
            "--nproc-per-node",
            type=arg_int(1, 4096),
            default=8,
            help="GPUs per node in that command",
        )
        p.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500", help="host:port of node 0")
        p.add_argument(
            "--print-command",
            action="store_true",
            help="only print the multi-node torchrun command, run nothing",
        )
        _common(p, device=False)
    p = sub.add_parser("nccl-log", help=BENCHMARKS["nccl-log"])
    p.add_argument("path", help="a saved all_reduce_perf / all_gather_perf / ... output")
    p.add_argument("--op", default=None, help="the collective, when the file name does not say")
    _common(p, device=False)


def measure(args: argparse.Namespace, *, progress: bool = True) -> Any:
    """Run the benchmark the arguments describe and return its result object."""
    from gpudiag import bench

    which = args.bench
    if which == "matmul":
        return bench.matmul(
            args.dtypes, args.sizes, device=args.device, repeats=args.repeats, progress=progress
        )
    if which == "bandwidth":
        return bench.bandwidth(
            args.kinds, args.sizes, device=args.device, repeats=args.repeats, progress=progress
        )
    if which == "attention":
        return bench.attention(
            args.seq_lens,
            args.backends,
            batch=args.batch,
            heads=args.heads,
            head_dim=args.head_dim,
            dtype=args.dtype,
            causal=not args.no_causal,
            backward=not args.no_backward,
            device=args.device,
            repeats=args.repeats,
            progress=progress,
        )
    if which == "nccl-log":
        return bench.parse_nccl_tests(args.path, op=args.op)
    return bench.allreduce(
        args.sizes,
        op=COLLECTIVE_COMMANDS[which],
        world_size=args.nproc,
        backend=args.backend,
        dtype=args.dtype,
        repeats=args.repeats,
        iters=args.iters,
        progress=progress,
    )


def multinode_command(args: argparse.Namespace) -> str | None:
    if getattr(args, "bench", None) not in COLLECTIVE_COMMANDS:
        return None
    from gpudiag.bench import torchrun_command

    return torchrun_command(
        COLLECTIVE_COMMANDS[args.bench],
        args.sizes,
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        dtype=args.dtype,
    )


def run(args: argparse.Namespace) -> int:
    if args.bench is None:
        print(benchmark_list())
        return 2
    command = multinode_command(args)
    if command is not None and args.print_command:
        print(command)
        return 0
    result = measure(args, progress=not args.json and sys.stderr.isatty())
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(repr(result))
    if command is not None:
        # stderr keeps stdout pure JSON under --json.
        print(
            f"\nOn several nodes, run on each node (rank 0 prints the result):\n  {command}",
            file=sys.stderr if args.json else sys.stdout,
        )
    if args.plot:
        result.plot().write_html(args.plot)
    return 1 if getattr(result, "error", "") else 0
