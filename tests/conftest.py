"""Shared test fixtures: where the recorded real-hardware data lives."""

from __future__ import annotations

from pathlib import Path

import pytest

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
