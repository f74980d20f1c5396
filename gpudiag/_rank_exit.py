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

A rank that fails also leaves its own error behind (``record_failure``, in the folder the
launcher names in ``GPUDIAG_RANK_ERRORS``): when one rank crashes, the others fail a moment
later with "Connection closed by peer" (gloo) or a store timeout, and whichever message comes
last in torchrun's output used to be what the user saw. ``first_failure`` puts the rank's own
error first: the errors of ranks that lost a peer after it, then by time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

# Set by the launcher (gpudiag.distributed.launch) to a folder: a rank that fails writes its own
# error there, so the caller reports the first failure, not the survivors' "connection closed".
ERRORS_DIR = "GPUDIAG_RANK_ERRORS"

_joined = False


def joined_a_group() -> None:
    """Note that this process ran a torch.distributed group (its ending is then ours)."""
    global _joined
    _joined = True


def record_failure(exc: BaseException) -> None:
    """Write this rank's error (its type, message and the time) for the launcher; once per
    rank (its first failure), and only when the launcher asked for it."""
    folder = os.environ.get(ERRORS_DIR)
    if not folder or not os.path.isdir(folder):
        return
    rank = os.environ.get("RANK", "")
    rank = rank if rank.isascii() and rank.isdigit() else str(os.getpid())
    path = os.path.join(folder, f"rank-{rank}.json")
    if os.path.exists(path):
        return
    data = {
        "rank": rank,
        "time": time.time(),
        "type": type(exc).__name__,
        "message": " ".join(str(exc).split())[:2000],
    }
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)


def run_main(main: Callable[[], int]) -> NoReturn:
    """A process entry point: ``main()``'s exit code; an uncaught exception is printed as
    Python would, recorded for the launcher (record_failure), and exits 1."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        record_failure(exc)
        traceback.print_exc()
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    exit_process(code)


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)``, or, after this process ran a process group, flush and ``os._exit``."""
    if not _joined:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        # A closed stream or a broken pipe: nothing more can be written there anyway.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


# What a rank says when another rank died: the consequence, never the cause.
_LOST_PEER = re.compile(
    r"Connection (?:closed|reset) by peer|connectFullMesh|Broken pipe|DistNetworkError|"
    r"DistStoreError|DistBackendError|Socket Timeout|recvBytes|sendBytes|remote process exited|"
    r"failed to recv|NCCL communicator was aborted|Timed out waiting|ProcessGroupGloo",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankFailure:
    """One rank's own error, as it wrote it (gpudiag._rank_exit.record_failure)."""

    rank: str
    time: float
    type: str
    message: str

    @property
    def lost_a_peer(self) -> bool:
        """The error is what a rank says when another one died, not a cause of its own."""
        return bool(_LOST_PEER.search(f"{self.type}: {self.message}"))

    def __str__(self) -> str:
        text = self.message if len(self.message) <= 300 else self.message[:297] + "..."
        return f"rank {self.rank}: {self.type}: {text}"


def rank_failures(folder: str | Path) -> list[RankFailure]:
    """The errors ranks wrote in ``folder``, first failure first: causes before the errors of
    ranks that lost a peer, then by time."""
    out = []
    for path in sorted(Path(folder).glob("rank-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            out.append(
                RankFailure(
                    str(data["rank"]), float(data["time"]), str(data["type"]), str(data["message"])
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda f: (f.lost_a_peer, f.time))


def _signal_deaths(text: str) -> list[str]:
    """Ranks torchrun reports killed by a signal (``exitcode : -9``): they wrote no error."""
    out = []
    for rank, code in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-\d+)", text):
        try:
            name = signal.Signals(-int(code)).name
        except ValueError:
            name = f"signal {-int(code)}"
        out.append(f"rank {rank} was killed by {name}")
    return list(dict.fromkeys(out))


def first_failure(failures: list[RankFailure], output: str) -> str:
    """The first failure in words: a rank's own error, then what the others said; without
    any (a rank killed by a signal writes none), what torchrun's ``output`` says."""
    deaths = _signal_deaths(output)
    if failures and not failures[0].lost_a_peer:
        first, rest = failures[0], failures[1:]
        text = f"{first} (the first failure)"
        if rest or deaths:
            text += "; then " + "; ".join([*deaths, *(str(f) for f in rest[:2])])
        return text
    if deaths:
        return "; ".join(deaths) + "".join(f"; then {f}" for f in failures[:2])
    if failures:
        return "; ".join(str(f) for f in failures[:3])
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "USDT" not in ln]
    causes = [ln for ln in lines if re.search(r"Error|error:|No module named", ln)]
    tail = list(dict.fromkeys(causes))[:3] or lines[-6:]
    return " | ".join(tail) or "no rank said why"
