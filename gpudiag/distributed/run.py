"""What ``gpudiag doctor|inspect|bench`` do on every rank of a torchrun job, and what rank 0 prints.

The NCCL path (one GPU per rank) is untested on a real GPU in this version of gpudiag; the gloo
path is tested with real processes on a CPU.
"""

from __future__ import annotations

import argparse
import io
import json
import socket
from collections.abc import Mapping, Sequence
from contextlib import redirect_stdout
from types import ModuleType
from typing import Any

from gpudiag._progress import ProgressFn
from gpudiag.analysis.nccl import CollectiveResult
from gpudiag.distributed.doctor import DOCTOR_CPU_SIZES, DistributedReport, gather_evidence
from gpudiag.distributed.group import (
    RankEnv,
    gather_to_rank0,
    process_group,
    rank_device,
    rank_env,
)
from gpudiag.errors import GpuDiagError
from gpudiag.probe import cuda

RANKS_FORMAT = "gpudiag-ranks"


def doctor(
    *,
    workload: str = "gpt",
    overrides: Mapping[str, Any] | None = None,
    steps: int = 5,
    profile: bool = True,
    collective: bool = True,
    sizes: Sequence[int] | None = None,
    threshold: float = 0.10,
) -> DistributedReport | None:
    """Run the doctor on this rank; rank 0 gets the merged report, the other ranks None.

    Outside torchrun it is a job of one rank (no collective) and says so.
    """
    env = rank_env()
    if env is None:
        device = "cuda:0" if cuda.available() else "cpu"
        one = RankEnv(rank=0, world_size=1, local_rank=0, local_world_size=1)
        evidence = gather_evidence(
            one, "none", device, workload=workload, overrides=overrides, steps=steps,
            profile=profile,
        )  # fmt: skip
        return DistributedReport.merge(
            [evidence],
            backend="none",
            notes=(
                "one process, not a torchrun job: run `torchrun --nproc-per-node=N -m gpudiag "
                "doctor` to see every rank, stragglers and collectives",
            ),
        )
    with process_group() as backend:
        device = rank_device(backend, env.local_rank)
        evidence = gather_evidence(
            env, backend, device, workload=workload, overrides=overrides, steps=steps,
            profile=profile,
        )  # fmt: skip
        gathered = gather_to_rank0(evidence)
        result: CollectiveResult | None = None
        if collective and env.world_size > 1:
            from gpudiag.bench.collectives import run_collective

            on_cpu = device == "cpu"
            result = run_collective(
                "all_reduce",
                list(sizes) if sizes else (list(DOCTOR_CPU_SIZES) if on_cpu else None),
                repeats=5 if on_cpu else None,
                iters=3 if on_cpu else None,
            )
        if gathered is None:
            return None
        return DistributedReport.merge(
            gathered, backend=backend, collective=result, threshold=threshold
        )


def on_every_rank(module: ModuleType, args: argparse.Namespace) -> int:
    """Run a subcommand (``inspect``, ``bench``) on every rank; rank 0 prints all the answers.

    With ``--json`` rank 0 prints one document whose ``ranks`` list holds each rank's JSON.
    """
    env = rank_env()
    if env is None:
        return int(module.run(args))
    with process_group() as backend:
        if backend == "nccl":
            rank_device(backend, env.local_rank)
        buffer = io.StringIO()
        error = ""
        code = 1
        try:
            with redirect_stdout(buffer):
                code = int(module.run(args))
        except GpuDiagError as exc:  # reported by rank 0, never left hanging in the gather
            error = str(exc)
        mine = {
            "rank": env.rank,
            "local_rank": env.local_rank,
            "host": socket.gethostname(),
            "exit_code": code,
            "error": error,
            "output": buffer.getvalue(),
        }
        gathered = gather_to_rank0(mine)
    if gathered is None:
        return 0
    worst = max(int(g["exit_code"]) for g in gathered)
    if getattr(args, "json", False):
        ranks = []
        for g in gathered:
            entry = {k: g[k] for k in ("rank", "local_rank", "host", "exit_code", "error")}
            try:
                entry["result"] = json.loads(g["output"]) if g["output"].strip() else None
            except json.JSONDecodeError:
                entry["result"] = g["output"]
            ranks.append(entry)
        doc = {
            "format": RANKS_FORMAT,
            "command": getattr(args, "command", ""),
            "world_size": env.world_size,
            "backend": backend,
            "ranks": ranks,
        }
        print(json.dumps(doc, indent=2))
    else:
        # A collective is one result for the whole job: identical answers are printed once.
        groups: dict[str, list[dict[str, Any]]] = {}
        for g in gathered:
            groups.setdefault(g["output"].rstrip() or f"error: {g['error']}", []).append(g)
        for text, members in groups.items():
            who = ", ".join(f"{g['rank']} on {g['host']}" for g in members)
            print(f"=== rank{'s' if len(members) > 1 else ''} {who} ===")
            print(text)
    return worst


def doctor_job(
    nproc: int = 2,
    *,
    workload: str = "gpt",
    overrides: Mapping[str, Any] | None = None,
    steps: int = 5,
    profile: bool = True,
    sizes: Sequence[int] | None = None,
    timeout_s: float = 300.0,
    progress: bool | ProgressFn = True,
) -> DistributedReport:
    """``torchrun --nproc-per-node=N -m gpudiag doctor --json`` started from this process (a
    notebook), its merged report read back. gloo on a CPU; one GPU per rank with NCCL.
    ``progress``: the seconds waited on the ranks (a bar, ``True``), none, or a callback."""
    from gpudiag._progress import resolve, ticking
    from gpudiag.distributed.launch import torchrun

    if nproc < 1:
        raise GpuDiagError(f"nproc must be at least 1, got {nproc}")
    args = ["gpudiag", "doctor", "--json", "--workload", workload, "--steps", str(int(steps))]
    for key, value in (overrides or {}).items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    if not profile:
        args.append("--no-profile")
    if sizes:
        args += ["--sizes", *(str(int(s)) for s in sizes)]
    with ticking(resolve(progress, "doctor"), f"{nproc} ranks", "doctor on every rank (torchrun)"):
        out = torchrun(args, nproc, timeout_s=timeout_s, check=False)
    try:
        return DistributedReport.from_dict(json.loads(out))
    except json.JSONDecodeError:
        raise GpuDiagError(f"the doctor printed no report: {out[-500:]!r}") from None
