"""Real-hardware tests (`pytest -m gpu`, `make gpu-check`): no fakes, the real libraries only.

Without CUDA every test marked ``gpu`` skips with the reason "needs a CUDA GPU". A test whose
feature this GPU lacks (MIG off, no GPM, no DCGM host engine) skips with "N/A: <why>". Each
test records the figure it measured with ``figure(...)``; ``gpudiag.cli.gpu_check`` prints
them in one table.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

NEEDS_CUDA = "needs a CUDA GPU"


def cuda_usable() -> bool:
    from gpudiag.probe import cuda

    return cuda.available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_usable():
        return
    skip = pytest.mark.skip(reason=NEEDS_CUDA)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def figure(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """Record the figure a GPU path measured (one line), for the gpu-check table."""

    def put(text: str) -> None:
        record_property("figure", text)

    return put


def cuda_time_s(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds per call of ``fn`` timed directly with CUDA events (no gpudiag code)."""
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
