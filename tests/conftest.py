"""Shared test fixtures: where the recorded real-hardware data lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.machines import FakeClock, cpu_system

REPO = Path(__file__).resolve().parents[1]
# Recorded real-GPU data (nvidia-smi XML, traces, topology, ...) sits beside the repository.
FIXTURES = REPO.parent / "shared" / "fixtures"


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
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_cpu_system() -> object:
    return cpu_system


@pytest.fixture
def bf16_cpu() -> object:
    return cpu_system("avx2", "avx512f", "avx512_bf16")
