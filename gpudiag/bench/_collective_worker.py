"""One rank of the collective benchmark: ``torchrun ... -m gpudiag.bench._collective_worker``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from gpudiag._rank_exit import joined_a_group, run_main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpudiag.bench._collective_worker", description=__doc__
    )
    p.add_argument("--op", default="all_reduce", help="all_reduce, all_gather or reduce_scatter")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="bytes (nccl-tests 'size')")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--backend", default=None, help="nccl or gloo (default: nccl with CUDA)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--out", default=None, help="rank 0 writes the result as JSON here")
    p.add_argument("--progress", action="store_true", help="rank 0 prints progress lines")
    p.add_argument("--json", action="store_true", help="rank 0 prints JSON instead of a table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch.distributed as dist

    from gpudiag.bench.collectives import PROGRESS_MARK, run_collective
    from gpudiag.probe import cuda

    backend = args.backend or ("nccl" if cuda.available() else "gloo")
    dist.init_process_group(backend)
    joined_a_group()
    try:
        rank = dist.get_rank()

        def report(done: int, total: int) -> None:
            if rank == 0 and args.progress:
                print(f"{PROGRESS_MARK} {done} {total}", flush=True)

        result = run_collective(
            args.op,
            args.sizes,
            dtype=args.dtype,
            repeats=args.repeats,
            iters=args.iters,
            on_progress=report,
        )
        if rank == 0:
            if args.out:
                with open(args.out, "w", encoding="utf-8") as fh:
                    json.dump(result.to_dict(), fh)
            if args.json:
                print(json.dumps(result.to_dict()))
            elif not args.progress:
                print(repr(result))
        dist.barrier()  # leave together (see gpudiag.distributed.group.process_group)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_main(main)
