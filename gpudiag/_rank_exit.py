"""How a process that ran a torch.distributed group ends: at once, once its output is out.

Even after ``destroy_process_group`` (and a barrier before it), a gloo rank sometimes aborts in
the interpreter's teardown with "terminate called without an active exception": on a loaded
2-core host, 1 run in 14 of a 2-rank profiled job, while every rank had written its results.
torchrun then reports the whole job as failed. The abort comes after the rank's work is done,
in the teardown of torch's and gloo's native threads at interpreter exit (torch pull request
#179291 proposed destroying groups in an atexit handler for a related abort and was abandoned
as more involved than it looked). So a rank process gpudiag itself started ends with
``os._exit`` once its streams are flushed: its output is all written by then, and the teardown
that aborts never runs. A process that never joined a group exits normally.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

_joined = False


def joined_a_group() -> None:
    """Note that this process ran a torch.distributed group (its ending is then ours)."""
    global _joined
    _joined = True


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)``, or, after this process ran a process group, flush and ``os._exit``."""
    if not _joined:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        # A closed stream or a broken pipe: nothing more can be written there anyway.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
