"""torchrun's environment, one process group per job, and gathering every rank's evidence.

gloo on a CPU and NCCL on GPUs through the same calls; the NCCL path is untested on a real GPU
in this version of gpudiag (this project's tests run 2 gloo processes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpudiag._rank_exit import joined_a_group
from gpudiag._values import digits
from gpudiag.errors import DistributedError
from gpudiag.probe import cuda

# Set by torchrun (torch.distributed.run) in every rank's environment.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


@dataclass(frozen=True)
class RankEnv:
    """Who this process is in a torchrun job, read from the variables torchrun sets."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master: str = ""

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    if not digits(text.strip()) or len(text.strip()) > 9:
        raise DistributedError(
            f"{name}={text!r} is not a whole number in ASCII digits (torchrun sets it to one)"
        )
    return int(text)


def rank_env(env: Mapping[str, str] | None = None) -> RankEnv | None:
    """This process's place in a torchrun job; None when it was not started by torchrun."""
    env = os.environ if env is None else env
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is None or world is None:
        return None
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"RANK={rank} WORLD_SIZE={world}: not a valid torchrun rank")
    local = _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE")
    return RankEnv(
        rank=rank,
        world_size=world,
        local_rank=rank if local is None else local,
        local_world_size=world if local_world is None else local_world,
        master=f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}".strip(":"),
    )


def backend_for_this_machine() -> str:
    """NCCL when CUDA is usable, else gloo."""
    return "nccl" if cuda.available() else "gloo"


def rank_device(backend: str, local_rank: int) -> str:
    """The device a rank works on: its local GPU with NCCL, the CPU with gloo."""
    if backend != "nccl":
        return "cpu"
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "set_device_index"):
        accelerator.set_device_index(local_rank)
    return f"cuda:{local_rank}"


@contextmanager
def process_group(backend: str | None = None, timeout_s: float = 300.0) -> Iterator[str]:
    """Join torchrun's job for a while (yields the backend); leaves it on every exit path.

    An already initialised group (the caller's own) is used as it is and left running.
    """
    import datetime

    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedError("this torch was built without torch.distributed")
    if dist.is_initialized():
        yield str(dist.get_backend())
        return
    if rank_env() is None:
        raise DistributedError(
            "not started by torchrun (RANK / WORLD_SIZE unset): run "
            "`torchrun --nproc-per-node=N -m gpudiag ...`"
        )
    backend = backend or backend_for_this_machine()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    joined_a_group()  # a gpudiag rank process then ends through gpudiag._rank_exit
    try:
        yield backend
        # Leave together: a rank that tears its group down while another still talks to it
        # (rank 0 printing the merged report) made gloo abort that rank at exit
        # ("terminate called without an active exception", about one run in two).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` (picklable) in rank order on rank 0; None on the other ranks.

    ``gather_object`` over the job's group: gloo carries it on a CPU; with NCCL torch moves the
    pickled bytes through the current GPU (its documented requirement), hence rank_device().
    """
    import torch.distributed as dist

    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
