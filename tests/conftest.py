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
