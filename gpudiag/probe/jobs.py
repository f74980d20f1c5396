"""Jobs gpudiag starts (torchrun and its ranks): watched, and ended with all they started.

torchrun starts each rank in a session of its own (``start_new_session=True`` in torch's
``SubprocessHandler``), so killing the launcher, or its process group, leaves the ranks
running: re-parented to init, holding the pipes a caller reads and, on a GPU machine, their
GPU memory. A job here is therefore:

- started in a session of its own (a terminal's Ctrl-C reaches only the caller, which then
  ends the job itself), with its output going to files, never pipes, so that nothing a
  straggler holds open can keep the caller waiting;
- watched: every ``POLL_S`` its descendants are recorded (pid and start time, so a reused pid
  is never killed), and each carries ``GPUDIAG_JOB=<id>`` in its environment, so one that was
  re-parented before it was seen is found too;
- ended on every exit path (success, failure, timeout, ``KeyboardInterrupt``, any exception):
  SIGTERM to everything of the job still alive, SIGKILL after ``GRACE_S``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import psutil

MARKER = "GPUDIAG_JOB"
POLL_S = 0.1
GRACE_S = 3.0


@dataclass(frozen=True)
class JobResult:
    """How a job ended: its exit code (negative: a signal), its output, whether it ran out of
    time, and how many of its processes were still alive at the end (then killed)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed: int = 0


def run_job(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    cwd: str | None = None,
    on_stdout_line: Callable[[str], None] | None = None,
    merge_stderr: bool = False,
) -> JobResult:
    """Run ``cmd`` as a job (see the module docstring) for at most ``timeout_s`` seconds.

    ``on_stdout_line`` gets each complete line of stdout as it is written (a progress bar);
    ``merge_stderr`` sends stderr to stdout, in order.
    """
    tag = uuid.uuid4().hex
    job_env = {**env, MARKER: tag}
    started = time.time()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=out if merge_stderr else err,
            stdin=subprocess.DEVNULL,
            env=job_env,
            cwd=cwd,
            start_new_session=True,
        )
        known: dict[int, psutil.Process] = {}
        reader = _LineReader(out, on_stdout_line)
        timed_out = False
        killed = 0
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=POLL_S)
                _record_descendants(proc.pid, known)
                reader.feed()
                if proc.returncode is not None:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
        finally:
            # Every exit path: the launcher if it still runs, ranks it left behind.
            killed = end_job(proc, known, tag, started)
        reader.feed(final=True)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", errors="replace")
        stderr = "" if merge_stderr else err.read().decode("utf-8", errors="replace")
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return JobResult(code, stdout, stderr, timed_out, killed)


class _LineReader:
    """Complete lines appended to a file since the last call, handed to a callback."""

    def __init__(self, fh: IO[bytes], callback: Callable[[str], None] | None) -> None:
        self.fh, self.callback, self.pos, self.partial = fh, callback, 0, b""

    def feed(self, *, final: bool = False) -> None:
        if self.callback is None:
            return
        self.fh.seek(self.pos)
        chunk = self.fh.read()
        self.pos += len(chunk)
        self.fh.seek(0, os.SEEK_END)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self.callback(line.decode("utf-8", errors="replace"))


def _record_descendants(pid: int, known: dict[int, psutil.Process]) -> None:
    try:
        for child in psutil.Process(pid).children(recursive=True):
            known.setdefault(child.pid, child)
    except psutil.Error:  # the launcher has just exited: its children are looked up by marker
        pass


def job_processes(tag: str, since: float = 0.0) -> list[psutil.Process]:
    """Live processes that carry job ``tag`` in their environment (started after ``since``)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if proc.pid == me or proc.info["create_time"] < since - 1:
                continue
            if proc.environ().get(MARKER) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def end_job(
    proc: subprocess.Popen[bytes], known: dict[int, psutil.Process], tag: str, since: float
) -> int:
    """SIGTERM everything of the job still alive, SIGKILL what is left after GRACE_S; the
    number of processes that had to be ended (the launcher included)."""
    targets: dict[int, psutil.Process] = {}
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            targets[proc.pid] = psutil.Process(proc.pid)
    _record_descendants(proc.pid, known)
    for p in [*known.values(), *job_processes(tag, since)]:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                targets.setdefault(p.pid, p)
    alive = list(targets.values())
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=GRACE_S)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(still, timeout=GRACE_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)
    return len(alive)


__all__ = ["GRACE_S", "MARKER", "POLL_S", "JobResult", "end_job", "job_processes", "run_job"]
