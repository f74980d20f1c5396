"""A process that ran a process group ends with os._exit after flushing; others exit normally."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys
from gpudiag._rank_exit import exit_process, joined_a_group
atexit.register(lambda: print("teardown ran", flush=True))
if sys.argv[1] == "joined":
    joined_a_group()
sys.stdout.write("report written")  # no newline, not flushed: exit_process must flush it
exit_process(int(sys.argv[2]))
"""


def _run(mode: str, code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_rank_process_ends_at_once_with_its_output_written() -> None:
    done = _run("joined", 5)
    assert done.returncode == 5
    assert done.stdout == "report written"  # flushed, and the interpreter's teardown skipped


def test_a_process_without_a_group_exits_normally() -> None:
    done = _run("alone", 3)
    assert done.returncode == 3
    assert done.stdout == "report writtenteardown ran\n"
