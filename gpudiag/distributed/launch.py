"""Starting N local ranks with ``python -m torch.distributed.run --standalone`` from any process.

The ranks import the same gpudiag as the caller (its folder goes first on PYTHONPATH) and the
caller's working directory (for ``module:function`` workloads); each gets a share of the CPUs
(OMP_NUM_THREADS) unless the caller set it. A watchdog kills a job that outlives its timeout (a
rendezvous that never completes must not hang a notebook).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from gpudiag.errors import DistributedError
from gpudiag.probe.host import usable_cpus


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
) -> str:
    """Run ``-m <module_args>`` on ``nproc`` local ranks; its output, or DistributedError.

    stdout is returned alone (rank 0's report); stderr only serves the error message. With
    ``check=False`` a job that exits non-zero still returns its stdout when it printed any
    (a doctor that found a broken rank still has a report).
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
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    ) as proc:
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        stdout, stderr = proc.communicate()
        code = proc.returncode
        timed_out = not watchdog.is_alive() and code != 0
        watchdog.cancel()
    if code == 0 or (not check and stdout.strip()):
        return stdout
    lines = [ln.strip() for ln in (stderr + stdout).splitlines() if ln.strip()]
    lines = [ln for ln in lines if "USDT" not in ln]
    causes = [ln for ln in lines if re.search(r"Error|error:|No module named", ln)]
    tail = list(dict.fromkeys(causes))[-3:] or lines[-6:]
    why = f"killed after the {timeout_s:.0f} s timeout" if timed_out else f"exit {code}"
    raise DistributedError(f"the {nproc}-rank job failed ({why}): " + " | ".join(tail))
