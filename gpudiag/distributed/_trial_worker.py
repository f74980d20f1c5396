"""One rank of a distributed trial: ``torchrun ... -m gpudiag.distributed._trial_worker PLAN OUT``.

PLAN is a JSON file written by gpudiag.experiment.distributed; rank 0 writes every rank's
results (gathered) as JSON to OUT.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence

from gpudiag._rank_exit import run_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        plan = json.load(fh)

    from gpudiag.distributed.group import (
        gather_to_rank0,
        process_group,
        rank_device,
        rank_env,
    )
    from gpudiag.distributed.trial import run_rank

    env = rank_env()
    if env is None:
        print("run this module under torchrun", file=sys.stderr)
        return 2
    with process_group(timeout_s=float(plan.get("group_timeout_s", 300))) as backend:
        device = rank_device(backend, env.local_rank)
        arms = run_rank(plan, device)
        mine = {
            "rank": env.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": device,
            "arms": [a.to_dict() for a in arms],
        }
        gathered = gather_to_rank0(mine)
        if gathered is not None:
            doc = {"backend": backend, "world_size": env.world_size, "ranks": gathered}
            with open(args[1], "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
    return 0


if __name__ == "__main__":
    run_main(main)
