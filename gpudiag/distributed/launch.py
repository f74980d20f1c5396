"""Starting N local ranks with ``python -m torch.distributed.run --standalone`` from any process.

The ranks import the same gpudiag as the caller (its folder goes first on PYTHONPATH) and the
caller's working directory (for ``module:function`` workloads); each gets a share of the CPUs
(OMP_NUM_THREADS) unless the caller set it. The job runs through gpudiag.probe.jobs: in a
session of its own, its output in files, and ended with every rank it started on success,
failure, timeout and Ctrl-C (a rendezvous that never completes must not hang a notebook, and a
rank must not outlive its caller). A rank that fails writes its own error (gpudiag._rank_exit),
so the caller reports the first failure, not what the other ranks said when they lost it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gpudiag._rank_exit import ERRORS_DIR, first_failure, rank_failures
from gpudiag.errors import DistributedError
from gpudiag.probe.host import usable_cpus
from gpudiag.probe.jobs import run_job


def _package_root() -> str:
    """The folder that holds the ``gpudiag`` package (this file is gpudiag/distributed/)."""
    return str(Path(__file__).resolve().parents[2])


def torchrun(
    module_args: Sequence[str],
    nproc: int,
    *,
    timeout_s: float = 600.0,
    cwd: str | None = None,
    check: bool = True,
    what: str = "job",
) -> str:
    """Run ``-m <module_args>`` on ``nproc`` local ranks; its output, or DistributedError.

    stdout is returned alone (rank 0's report); stderr only serves the error message. With
    ``check=False`` a job that exits non-zero still returns its stdout when it printed any
    (a doctor that found a broken rank still has a report). ``what`` names the job in errors
    ("the 2-rank trial failed ...").
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        *module_args,
    ]
    env = dict(os.environ)
    paths = (_package_root(), cwd or os.getcwd(), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // max(1, nproc))))
    with tempfile.TemporaryDirectory(prefix="gpudiag-ranks-") as errors:
        env[ERRORS_DIR] = errors
        result = run_job(cmd, env=env, timeout_s=timeout_s, cwd=cwd)
        failures = rank_failures(errors)
    if result.returncode == 0 and not result.timed_out:
        return result.stdout
    if not check and result.stdout.strip() and not result.timed_out:
        return result.stdout
    if result.timed_out:
        why = (
            first_failure(failures, "")
            if failures
            else "no rank reported an error: a rank was still working or waiting for another "
            "(a step that hangs, a rendezvous that never completes)"
        )
        raise DistributedError(
            f"the {nproc}-rank {what} did not finish within its {timeout_s:g} s timeout "
            f"(timeout_s); every rank was stopped. {why}"
        )
    raise DistributedError(
        f"the {nproc}-rank {what} failed: " + first_failure(failures, result.stdout + result.stderr)
    )
