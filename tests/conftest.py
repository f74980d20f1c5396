"""Shared test fixtures: where the recorded real-hardware data lives."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.machines import cpu_system

REPO = Path(__file__).resolve().parents[1]
# Recorded real-GPU data (nvidia-smi XML, traces, topology, ...), copied into the repository
# with each folder's SOURCES.md: a clone tests with nothing beside it.
FIXTURES = REPO / "tests" / "fixtures"

# Files the test session opened beside the repository (a sibling folder, e.g. the corpus the
# fixtures were copied from):
# a fresh clone has nothing there, so any such read fails the session (see pytest_sessionfinish).
_OUTSIDE_READS: list[str] = []
_INTERPRETER = tuple({sys.prefix + os.sep, sys.base_prefix + os.sep, sys.exec_prefix + os.sep})


def _watched_siblings() -> tuple[str, ...]:
    """The folders beside the repository whose files no test may read: those there when the
    session starts, and ``shared`` (where the fixture corpus sits beside a checkout). A clone in
    the temporary directory sits beside every process's scratch files (pytest, tempfile, torch's
    compile cache), so there only ``shared`` is watched."""
    names = {"shared"}
    if REPO.parent != Path(tempfile.gettempdir()).resolve():
        names |= {p.name for p in REPO.parent.iterdir() if p.is_dir() and p != REPO}
    beside = REPO.parent
    return tuple(str(beside / name) + os.sep for name in sorted(names))


_WATCHED = _watched_siblings()


def _watch_opens(event: str, args: tuple[object, ...]) -> None:
    if event != "open" or not args or not isinstance(args[0], str):
        return
    path = os.path.abspath(args[0])
    if path.startswith(_WATCHED) and not path.startswith(_INTERPRETER) and len(_OUTSIDE_READS) < 20:
        _OUTSIDE_READS.append(path)


sys.addaudithook(_watch_opens)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _OUTSIDE_READS:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                "tests read files outside the repository (copy them into tests/fixtures/):",
                red=True,
            )
            for path in dict.fromkeys(_OUTSIDE_READS):
                reporter.write_line(f"  {path}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"recorded fixtures not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture(scope="session")
def ipython_shell():  # type: ignore[no-untyped-def]
    """One in-process IPython shell for every magic test, with gpudiag loaded.

    ``globalipapp.get_ipython()`` returns None once some other test has made the shell, so fall
    back to the existing instance.
    """
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpudiag")
    return shell


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A one-process gloo group (in-memory store) for code that needs torch.distributed."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_cpu_system() -> object:
    return cpu_system


@pytest.fixture
def bf16_cpu() -> object:
    return cpu_system("avx2", "avx512f", "avx512_bf16")
