"""gpudiag.probe.jobs: a job's processes end with it, even those in sessions of their own.

The job below starts a child in a new session (as torchrun starts its ranks) that ignores
SIGTERM and holds the job's output file open; each case then counts, with psutil, the live
processes that carry the job's marker: none may be left.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import psutil
import pytest

from gpudiag.probe import jobs

# A launcher that starts a "rank" in a session of its own, then waits for it (or exits at once).
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    rank = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('rank up', flush=True); time.sleep(600)"],
        start_new_session=True,
    )
    print("launcher up", flush=True)
    if sys.argv[1] == "leave":
        sys.exit(3)  # the launcher fails, its rank keeps running (re-parented to init)
    rank.wait()
    """
)


def _left(tag_holder: list[str]) -> list[psutil.Process]:
    return [p for tag in tag_holder for p in jobs.job_processes(tag)]


@pytest.fixture
def tags(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The markers of the jobs a test starts (uuid4 is replaced to know them)."""
    seen: list[str] = []
    real = jobs.uuid.uuid4

    class _Id:
        def __init__(self) -> None:
            self.hex = real().hex
            seen.append(self.hex)

    monkeypatch.setattr(jobs.uuid, "uuid4", _Id)
    return seen


def _run(mode: str, timeout_s: float, **kwargs: object) -> jobs.JobResult:
    return jobs.run_job(
        [sys.executable, "-c", LAUNCHER, mode],
        env=dict(os.environ),
        timeout_s=timeout_s,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_launcher_that_exits_leaves_no_rank_behind(tags: list[str]) -> None:
    seen: list[str] = []
    result = _run("leave", 120, on_stdout_line=seen.append, merge_stderr=True)
    assert result.returncode == 3
    assert not result.timed_out
    assert result.killed >= 1  # the rank, found by its marker after the launcher had gone
    assert _left(tags) == []


def test_a_job_past_its_timeout_is_ended_with_every_process(tags: list[str]) -> None:
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)

    t0 = time.perf_counter()
    result = _run("wait", 8, on_stdout_line=on_line, merge_stderr=True)
    assert result.timed_out
    assert result.killed >= 2  # the launcher and its rank (which ignores SIGTERM)
    assert time.perf_counter() - t0 < 60
    assert _left(tags) == []
    assert "launcher up" in lines  # output arrived line by line while the job ran


def test_ctrl_c_while_waiting_ends_the_job(tags: list[str]) -> None:
    def interrupt(line: str) -> None:
        if line == "rank up":
            raise KeyboardInterrupt  # what Ctrl-C raises in the waiting caller

    with pytest.raises(KeyboardInterrupt):
        _run("wait", 120, on_stdout_line=interrupt, merge_stderr=True)
    assert _left(tags) == []
