"""One rank of a 2-process gloo job profiled with torch.profiler (run under torchrun).

Rank 1 is the slow host: extra matrix work and a 150 ms pause before each all-reduce (the pause
keeps it last even when the machine is busy), so rank 0 waits for it there and the analysis
should name rank 1 as the rank that arrives last. Usage:
``python -m torch.distributed.run --standalone --nproc-per-node=2 gloo_profile_worker.py OUT``
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from gpudiag._rank_exit import exit_process, joined_a_group

STEPS = 3
ALL_REDUCE_ELEMENTS = 1 << 18  # fp32: 1 MiB
ALL_GATHER_ELEMENTS = 1 << 10  # per rank
SLOW_RANK_PAUSE_S = 0.15  # well above what a loaded 2-core host's scheduler adds


def main(out: str) -> None:
    dist.init_process_group("gloo")
    joined_a_group()
    rank = dist.get_rank()
    world = dist.get_world_size()
    grads = torch.ones(ALL_REDUCE_ELEMENTS)
    shard = torch.full((ALL_GATHER_ELEMENTS,), float(rank))
    gathered = torch.empty(world * ALL_GATHER_ELEMENTS)
    a = torch.randn(384, 384)
    dist.barrier()  # both profilers start together, whatever the start-up of each process took
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(STEPS):
            if rank == 1:
                for _ in range(8):
                    a = torch.tanh(a @ a)
                time.sleep(SLOW_RANK_PAUSE_S)
            dist.all_reduce(grads)
            dist.all_gather_into_tensor(gathered, shard)
            prof.step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    assert torch.equal(grads, torch.full_like(grads, float(world**STEPS)))
    # Leave together: a rank that tears its gloo group down while the other still exports its
    # trace aborted that rank at exit (SIGABRT, about one run in eight on a 2-core host); the
    # rarer abort in the teardown after it is avoided by ending as gpudiag's ranks end.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    exit_process(0)
