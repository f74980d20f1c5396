"""The cluster rules on planted samples, and on the real recordings (where they stay quiet)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import build_feed
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity
from tests.conftest import FIXTURES

CLUSTER_RULES = [
    "cluster.straggler",
    "cluster.throttled_node",
    "cluster.gpu_errors",
    "cluster.memory_some_ranks",
    "cluster.tensor_cores_idle",
]
ROWS = 30


def frame(
    nodes: int,
    gpus: int,
    value: Callable[[int, int, str, int], float],
    metrics: tuple[str, ...] = ("sm_active_pct", "gpu_util_pct"),
) -> pd.DataFrame:
    """Samples shaped like Monitor.samples() of a cluster: columns (node-N/gpuG, metric)."""
    columns, data, hosts = [], [], {}
    for n in range(nodes):
        for g in range(gpus):
            device = f"node-{n}/gpu{g}"
            hosts[device] = f"node-{n}"
            for metric in metrics:
                columns.append((device, metric))
                data.append([value(n, g, metric, k) for k in range(ROWS)])
    df = pd.DataFrame(
        np.array(data).T,
        columns=pd.MultiIndex.from_tuples(columns, names=["device", "metric"]),
    )
    df.attrs.update({"label": "planted", "hosts": hosts})
    return df


def findings(samples: object) -> list:
    return list(run_rules(EvidenceBundle(samples=samples, env=None), only=CLUSTER_RULES).findings)


def wave(k: int) -> float:
    return 3.0 * np.sin(k / 3.0)


def test_one_lagging_gpu_is_the_straggler() -> None:
    df = frame(4, 2, lambda n, g, m, k: (25 if (n, g) == (2, 1) else 85) + wave(k))
    (f,) = findings(df)
    assert f.id == "cluster.straggler"
    assert f.message.startswith("node-2/gpu1 lags")
    assert f.severity is Severity.HIGH  # 60 points under the rest
    assert f.evidence[0].value == pytest.approx(25, abs=3)


def test_a_whole_lagging_node_is_named_once() -> None:
    df = frame(4, 2, lambda n, g, m, k: (55 if n == 3 else 85) + wave(k))
    (f,) = findings(df)
    assert f.message.startswith("node node-3 lags")
    assert f.severity is Severity.MEDIUM


@pytest.mark.parametrize(
    "value",
    [
        lambda n, g, m, k: 80 + 8 * ((n * 2 + g) % 3) + wave(k),  # spread, nobody apart
        lambda n, g, m, k: (20 if n < 2 else 85) + wave(k),  # half the job: not one straggler
        lambda n, g, m, k: (2 if (n, g) == (0, 0) else 20) + wave(k),  # an idle job
    ],
    ids=["spread", "half", "idle"],
)
def test_no_straggler_without_one(value: Callable[[int, int, str, int], float]) -> None:
    assert [f.id for f in findings(frame(4, 2, value))] == []


def test_without_sm_active_the_graphics_engine_stands_in_and_says_so() -> None:
    df = frame(3, 1, lambda n, g, m, k: 20 if n == 1 else 90, metrics=("gr_engine_active_pct",))
    (f,) = findings(df)
    assert "gr_engine_active_pct: SM active is not exported" in f.message


def test_one_throttled_busy_node() -> None:
    def value(n: int, g: int, m: str, k: int) -> float:
        hot = n == 1
        return {
            "throttled": float(hot and k % 2 == 0),
            "sm_clock_mhz": 1400.0 if hot else 1980.0,
            "gpu_util_pct": 95.0,
        }[m]

    df = frame(3, 2, value, metrics=("throttled", "sm_clock_mhz", "gpu_util_pct"))
    (f,) = findings(df)
    assert f.id == "cluster.throttled_node"
    assert "node node-1 (2 GPUs)" in f.message
    assert [e.value for e in f.evidence if "SM clock" in e.name] == [1400, 1980]


def test_every_node_throttled_is_not_one_node() -> None:
    df = frame(
        3,
        1,
        lambda n, g, m, k: 1.0 if m == "throttled" else 95.0,
        metrics=("throttled", "gpu_util_pct"),
    )
    assert findings(df) == []


def test_xid_and_ecc_errors() -> None:
    def value(n: int, g: int, m: str, k: int) -> float:
        if m == "xid_last":
            return 79.0 if (n, g) == (1, 0) and k > 10 else 0.0
        return 2.0 + (k > 20) if (n, g) == (0, 1) else 0.0

    df = frame(2, 2, value, metrics=("xid_last", "ecc_uncorrected_volatile"))
    by_id = {f.id: f for f in findings(df)}
    assert "the GPU has fallen off the bus" in by_id["cluster.xid_error"].message
    assert by_id["cluster.xid_error"].message.startswith("node-1/gpu0 reported XID 79")
    ecc = by_id["cluster.ecc_error"]
    assert ecc.message.startswith("node-0/gpu1: 3 uncorrected ECC errors, 1 during the run")


def test_memory_full_on_some_ranks_only() -> None:
    df = frame(
        2,
        4,
        lambda n, g, m, k: 97.0 if (n, g) in {(0, 0), (1, 0)} else 60.0,
        metrics=("memory_used_pct",),
    )
    (f,) = findings(df)
    assert f.id == "cluster.memory_some_ranks"
    assert "2 of 8 GPUs only (node-0/gpu0, node-1/gpu0)" in f.message


def test_idle_tensor_pipes_in_a_busy_job_point_at_bf16() -> None:
    busy_fp32 = frame(
        2,
        2,
        lambda n, g, m, k: 0.2 if m == "tensor_active_pct" else 80.0,
        metrics=("tensor_active_pct", "sm_active_pct"),
    )
    (f,) = findings(busy_fp32)
    assert f.id == "cluster.tensor_cores_idle"
    assert f.fix is not None
    assert f.fix.id == "precision.bf16"
    using_them = frame(
        2,
        2,
        lambda n, g, m, k: 30.0 if m == "tensor_active_pct" else 80.0,
        metrics=("tensor_active_pct", "sm_active_pct"),
    )
    assert findings(using_them) == []


@pytest.mark.parametrize(
    "recording",
    ["demo", str(FIXTURES / "recorded" / "cpu-host-epyc-2core" / "monitor.jsonl")],
)
def test_the_real_recordings_raise_no_cluster_finding(recording: str) -> None:
    # demo: five real GPUs of five machines (idle; the RTX 3090 idles under sw_power_cap at
    # the same 210 MHz as the rest, which holds nobody up).
    m = Monitor(build_feed(replay=recording, loop=False), interval=1.0, start=False)
    for _ in range(60):
        if m.tick().finished:
            break
    assert findings(m) == []
