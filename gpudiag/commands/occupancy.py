"""Theoretical occupancy of a kernel launch (NVIDIA's occupancy rules), and the best block size."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any

from gpudiag._values import arg_int
from gpudiag.analysis.occupancy import (
    Occupancy,
    OccupancyInputError,
    best_block_size,
    block_size_advice,
    occupancy,
)

_STATIC_SMEM_MAX = 48 * 1024


def _bytes(text: str) -> int:
    """'4096', '48K', '48KiB', '1.5k' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(k|kb|kib)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 4096 or 48K)")
    value = float(match.group(1)) * (1024 if match.group(2) else 1)
    if not value.is_integer() or value > 1 << 40:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes (up to 1 TiB)")
    return int(value)


# Options take ASCII whole numbers; their ranges are checked by gd.occupancy itself, which says
# which limit of the GPU a value breaks.
def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--cc", default=None, help="compute capability: 8.0, 9.0, sm_90 (default 8.0)"
    )
    where.add_argument(
        "--gpu", metavar="NAME", help="a GPU name from the spec table, e.g. 'H100 PCIe'"
    )
    parser.add_argument(
        "--threads", type=arg_int(high=1 << 31), default=256, help="threads per block (default 256)"
    )
    parser.add_argument(
        "--regs", type=arg_int(high=1 << 31), default=32, help="registers per thread (default 32)"
    )
    parser.add_argument(
        "--smem",
        type=_bytes,
        default=0,
        help="shared memory per block in bytes (48K style allowed; above 48 KiB counts as dynamic)",
    )
    parser.add_argument(
        "--dynamic-smem", type=_bytes, default=0, help="extra dynamic shared memory"
    )
    carve = parser.add_mutually_exclusive_group()
    carve.add_argument(
        "--carveout-kib", type=arg_int(high=1 << 31), default=None, help="L1/shared split in KiB"
    )
    carve.add_argument(
        "--carveout-percent",
        type=arg_int(high=1 << 31),
        default=None,
        help="cudaFuncAttributePreferredSharedMemoryCarveout (0-100; -1 default)",
    )
    parser.add_argument(
        "--barriers",
        type=arg_int(high=1 << 31),
        default=1,
        help="named barriers per block (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


@dataclass(frozen=True)
class Question:
    """The launch the arguments describe, ready for the calculator."""

    cc: Any
    threads: int
    regs: int
    static_smem: int
    dynamic_smem: int
    carveout_kib: int | None
    carveout_percent: int | None
    barriers: int
    assumed: str = ""  # what was assumed because the arguments did not say

    def kwargs(self) -> dict[str, Any]:
        return {
            "dynamic_smem_per_block": self.dynamic_smem,
            "carveout_kib": self.carveout_kib,
            "carveout_percent": self.carveout_percent,
            "barriers_per_block": self.barriers,
        }


def question(args: argparse.Namespace) -> Question:
    """Read the shared arguments of ``gpudiag occupancy`` and ``%gpudiag occupancy``."""
    cc: Any = args.cc or "8.0"
    assumed = (
        ""
        if args.cc or args.gpu
        else "compute capability 8.0 (A100) assumed: neither --cc nor --gpu was given "
        "(gpudiag does not read it from this machine); pass --gpu NAME or --cc X.Y"
    )
    if args.gpu:
        from gpudiag import specs

        spec = specs.lookup_gpu(args.gpu)
        if spec is None:
            raise OccupancyInputError(
                f"{args.gpu!r} is not in the spec table; give its compute capability with --cc."
            )
        cc = spec.compute_capability
    static = min(args.smem, _STATIC_SMEM_MAX)
    return Question(
        cc=cc,
        threads=args.threads,
        regs=args.regs,
        static_smem=static,
        dynamic_smem=args.smem - static + args.dynamic_smem,
        carveout_kib=args.carveout_kib,
        carveout_percent=args.carveout_percent,
        barriers=args.barriers,
        assumed=assumed,
    )


def answer(q: Question) -> tuple[Occupancy, Occupancy | None]:
    """(occupancy of the launch, occupancy at the best block size or None if none launches)."""
    occ = occupancy(q.cc, q.threads, q.regs, q.static_smem, **q.kwargs())
    try:
        _, best = best_block_size(q.cc, q.regs, q.static_smem, **q.kwargs())
    except OccupancyInputError:
        best = None
    return occ, best


def render_text(occ: Occupancy, best: Occupancy | None, q: Question | None = None) -> str:
    smem = occ.smem_per_block_bytes + occ.dynamic_smem_per_block_bytes
    lines = [
        f"compute capability {occ.cc[0]}.{occ.cc[1]}: {occ.threads_per_block} threads/block, "
        f"{occ.regs_per_thread} registers/thread, {smem} B shared memory/block, "
        f"carveout {occ.carveout}",
    ]
    if occ.can_launch:
        lines.append(
            f"occupancy {occ.occupancy_pct:.1f}%: {occ.active_blocks_per_sm} blocks/SM x "
            f"{occ.warps_per_block} warps = {occ.active_warps_per_sm} of "
            f"{occ.max_warps_per_sm} warps"
        )
        lines.append(f"limited by: {', '.join(occ.limiting)}")
    else:
        lines.append(f"cannot launch: {occ.reason}")
    lines.append("blocks per SM each resource allows:")
    for name, value in occ.blocks_limit.items():
        mark = "  <- limiting" if name in occ.limiting else ""
        lines.append(f"  {name:<14} {'no limit' if value is None else value}{mark}")
    if occ.shared_memory_config_bytes is not None:
        smallest = (occ.min_shared_memory_config_bytes or 0) // 1024
        lines.append(
            f"shared memory config: {occ.shared_memory_config_bytes // 1024} KiB "
            f"(smallest giving the same blocks: {smallest} KiB); "
            f"allocated per block: {occ.allocated_smem_per_block_bytes} B"
        )
    lines += [f"note: {n}" for n in occ.notes]
    lines += block_size_advice(
        occ,
        best,
        carveout_kib=q.carveout_kib if q else None,
        carveout_percent=q.carveout_percent if q else None,
        barriers_per_block=q.barriers if q else 1,
    )
    if q is not None and q.assumed:
        lines.append(f"note: {q.assumed}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    q = question(args)
    occ, best = answer(q)
    if args.json:
        out = occ.to_dict()
        out["best_block_size"] = best.threads_per_block if best is not None else None
        out["best_occupancy"] = best.occupancy if best is not None else None
        out["assumed"] = q.assumed or None
        print(json.dumps(out, indent=2))
    else:
        print(render_text(occ, best, q))
    return 0
