"""Utilization rules over monitor samples (DataFrames shaped like Monitor.samples())."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity


def _samples(columns: dict[tuple[str, str], np.ndarray]) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    index = pd.DatetimeIndex(pd.to_datetime(np.arange(n) * 0.1, unit="s", utc=True), name="time")
    frame = pd.DataFrame(
        dict(columns),
        index=index,
    )
    frame.columns = pd.MultiIndex.from_tuples(list(columns), names=["device", "metric"])
    return frame


def _found(samples: object) -> dict[str, Severity]:
    diagnosis = run_rules(EvidenceBundle(samples=samples, env={}))
    return {f.id: f.severity for f in diagnosis.findings}


def test_low_gpu_utilization() -> None:
    util = np.full(100, 35.0)
    assert "util.low_gpu_utilization" in _found(_samples({("gpu0", "gpu_util_pct"): util}))


def test_busy_gpu_is_fine() -> None:
    util = np.full(100, 97.0)
    assert _found(_samples({("gpu0", "gpu_util_pct"): util})) == {}


def test_fluctuating_gpu_utilization() -> None:
    util = np.tile([99.0, 99.0, 99.0, 0.0], 25)
    found = _found(_samples({("gpu0", "gpu_util_pct"): util}))
    assert found == {"util.fluctuating_gpu_utilization": Severity.LOW}


def test_imbalance_across_gpus() -> None:
    found = _found(
        _samples(
            {
                ("gpu0", "gpu_util_pct"): np.full(50, 95.0),
                ("gpu1", "gpu_util_pct"): np.full(50, 40.0),
            }
        )
    )
    assert "util.gpu_imbalance" in found


def test_cpu_bottleneck() -> None:
    found = _found(
        _samples(
            {
                ("gpu0", "gpu_util_pct"): np.full(50, 20.0),
                ("host", "cpu_util_pct"): np.full(50, 98.0),
            }
        )
    )
    assert found["util.cpu_bottleneck"] is Severity.HIGH


@pytest.mark.parametrize("n", [3, 0])
def test_too_few_samples_is_not_evaluated(n: int) -> None:
    frame = _samples({("gpu0", "gpu_util_pct"): np.full(max(n, 1), 10.0)}).iloc[:n]
    diagnosis = run_rules(EvidenceBundle(samples=frame, env={}))
    assert "util.gpu_utilization" in {x.rule for x in diagnosis.not_evaluated}
    assert diagnosis.findings == ()


def test_a_monitor_object_is_read_through_samples() -> None:
    frame = _samples({("gpu0", "gpu_util_pct"): np.full(20, 30.0)})

    class FakeMonitor:
        def samples(self) -> pd.DataFrame:
            return frame

    assert "util.low_gpu_utilization" in _found(FakeMonitor())
