"""gd.monitor(prometheus=...) against a real Prometheus scraping real dcgm-exporter pages.

One Prometheus server (Debian's binary, 1 s scrapes) reads three nodes of two GPUs each,
served from the recorded L4 scrape with moving values and one planted straggler; one monitor
runs over it for a few ticks, and every test reads that run. Under CI=true the binary must be
there (``.ci/run`` installs it); elsewhere the module skips without it.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import gpudiag as gd
from gpudiag.cli import monitor as cli_monitor
from gpudiag.monitoring import Monitor
from gpudiag.probe.prometheus import PrometheusBackend
from gpudiag.rules.engine import EvidenceBundle, run_rules
from tests.fakes.cluster import ExporterFarm, PrometheusServer, prometheus_or_skip
from tests.ui.test_monitor_widget import RecordingComm, comms, rows_messages  # noqa: F401

pytestmark = pytest.mark.slow

NODES, GPUS = 3, 2
STRAGGLER = (1, 1)
MIB = 1 << 20
INTERVAL_S = 0.5
LIVE_ROWS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    prometheus_or_skip()
    farm = ExporterFarm(NODES, GPUS, straggler=STRAGGLER)
    server = PrometheusServer(farm, tmp_path_factory.mktemp("prometheus"))
    try:
        yield server.start(scrapes=6)  # history for the range query to return
    finally:
        server.stop()
        farm.close()


@pytest.fixture(scope="module")
def run(cluster: PrometheusServer) -> Monitor:
    """A monitor over the cluster: its history from a range query, then a few live ticks."""
    backend = PrometheusBackend(cluster.url, '{job="dcgm"}', lag_s=2.0)
    m = gd.monitor(backend=backend, interval=INTERVAL_S, history_s=60, display=False)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _live_rows(m) < LIVE_ROWS and m.running:
            time.sleep(0.1)
    finally:
        m.stop()
    assert m.error is None
    assert _live_rows(m) >= LIVE_ROWS
    return m


def _backfilled(m: Monitor) -> int:
    note = next(n for n in m.notes if n.startswith("history: "))
    return int(note.split()[1])


def _live_rows(m: Monitor) -> int:
    history = [n for n in m.notes if n.startswith("history: ")]
    return m.ring.count - (int(history[0].split()[1]) if history else 0)


def _by_gpu(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """(device id, DCGM field) -> value, from Prometheus's own answer."""
    return {
        (f"{r['metric']['Hostname']}/gpu{r['metric']['gpu']}", r["metric"]["__name__"]): float(
            r["value"][1]
        )
        for r in result
    }


# What a monitor column is, in Prometheus's terms: (field, scale).
COLUMNS = {
    "gpu_util_pct": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "sm_active_pct": ("DCGM_FI_PROF_SM_ACTIVE", 100.0),
    "tensor_active_pct": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
    "memory_used_bytes": ("DCGM_FI_DEV_FB_USED", float(MIB)),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "xid_last": ("DCGM_FI_DEV_XID_ERRORS", 1.0),
}


def test_one_row_per_node_and_gpu(run: Monitor) -> None:
    ids = [d.id for d in run.devices]
    assert ids == [f"node-{n:02d}/gpu{g}" for n in range(NODES) for g in range(GPUS)]
    assert {d.host for d in run.devices} == {"node-00", "node-01", "node-02"}
    assert run.label == "Prometheus 127.0.0.1:" + run.label.split(":")[1]


def test_live_rows_equal_what_prometheus_answers_for_the_same_query(
    run: Monitor, cluster: PrometheusServer
) -> None:
    backend = run.feed.backend  # type: ignore[attr-defined]
    t, v = run.ring.last()
    index = {(s.device, s.metric): i for i, s in enumerate(run.series)}
    live = range(_backfilled(run), t.size)
    assert len(live) >= LIVE_ROWS
    compared = 0
    for k in live:
        answer = _by_gpu(cluster.query(backend.query, float(t[k])))
        for device in (d.id for d in run.devices):
            for column, (field, scale) in COLUMNS.items():
                if (device, field) not in answer:
                    continue  # not exported (XID: absent from the L4 scrape)
                assert v[k, index[(device, column)]] == answer[(device, field)] * scale
                compared += 1
    assert compared >= len(live) * NODES * GPUS * 5


def test_history_rows_equal_the_range_query(run: Monitor, cluster: PrometheusServer) -> None:
    backend = run.feed.backend  # type: ignore[attr-defined]
    n = _backfilled(run)
    assert n >= 2
    t, v = run.ring.last()
    series = cluster.query_range(backend.query, float(t[0]), float(t[n - 1]), INTERVAL_S)
    col = {s.device: i for i, s in enumerate(run.series) if s.metric == "sm_active_pct"}
    checked = 0
    for r in series:
        if r["metric"]["__name__"] != "DCGM_FI_PROF_SM_ACTIVE":
            continue
        device = f"{r['metric']['Hostname']}/gpu{r['metric']['gpu']}"
        for stamp, text in r["values"]:
            k = int(np.flatnonzero(np.isclose(t[:n], float(stamp), atol=1e-3, rtol=0))[0])
            assert v[k, col[device]] == float(text) * 100.0
            checked += 1
    assert checked >= n * NODES * GPUS // 2


def test_the_widget_sends_the_same_series_and_the_node_view_aggregates_them(
    run: Monitor,
    comms: list[RecordingComm],  # noqa: F811
) -> None:
    from gpudiag.ui.monitor import VIEW_BY_NODE, VIEW_EVERY_GPU, MonitorChart

    chart = MonitorChart(run, view=VIEW_EVERY_GPU)
    chart.backfill()
    comm = next(c for c in comms if c is chart.comm)
    _content, t, sent = rows_messages(comm)[-1]
    ring_t, ring_v = run.ring.last(len(t))
    np.testing.assert_array_equal(t, ring_t)
    np.testing.assert_array_equal(sent, ring_v.astype(np.float32))

    chart.show(VIEW_BY_NODE)
    spec = chart.spec
    assert [d["id"] for d in spec["devices"]] == [f"node:node-0{n}" for n in range(NODES)]
    _content, t, sent = rows_messages(comm)[-1]
    shown = [tuple(s) for s in spec["series"]]
    mean = shown.index(("node:node-01", "sm_active_pct", "mean"))
    low = shown.index(("node:node-01", "sm_active_pct", "min"))
    cols = [i for i, s in enumerate(run.series) if s.metric == "sm_active_pct"]
    node1 = [i for i in cols if run.series[i].device.startswith("node-01/")]
    _, ring_v = run.ring.last(len(t))
    np.testing.assert_allclose(sent[:, mean], ring_v[:, node1].mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(sent[:, low], ring_v[:, node1].min(axis=1), rtol=1e-6)
    chart.close()


def test_the_planted_straggler_is_found(run: Monitor) -> None:
    diagnosis = run_rules(
        EvidenceBundle(samples=run, env=None),
        only=["cluster.straggler", "cluster.memory_some_ranks", "cluster.throttled_node"],
    )
    (finding,) = diagnosis.findings
    assert finding.id == "cluster.straggler"
    assert finding.message.startswith("node-01/gpu1 lags")
    own, overall = (e.value for e in finding.evidence[:2])
    assert 15 <= own <= 25  # served: 20 % +- 5 (a slow wave)
    assert 75 <= overall <= 85  # the others: 80 % +- 5


def test_a_selector_that_matches_nothing_says_where_the_series_are(
    cluster: PrometheusServer,
) -> None:
    m = gd.monitor(prometheus=cluster.url, selector='{job="nope"}', display=False)
    try:
        (_device,) = m.devices
        deadline = time.monotonic() + 30
        while m.ring.count < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        reasons = {reason for _, reason in m.na_reasons().values()}
    finally:
        m.stop()
    assert any('no DCGM series match {job="nope"}' in r and 'job="dcgm"' in r for r in reasons)


def test_the_terminal_command_reads_prometheus(cluster: PrometheusServer) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli_monitor.add_arguments(parser)
    args = parser.parse_args(
        ["--prometheus", cluster.url, "--selector", '{job="dcgm"}', "--duration", "2", "--json"]
    )
    out = io.StringIO()
    assert cli_monitor.run(args, out) == 0
    payload = json.loads(out.getvalue())
    assert len(payload["monitor"]["devices"]) == NODES * GPUS
    assert payload["monitor"]["interval_s"] == 1.0  # a cluster's default
    util = payload["samples"]["series"].index(["node-01/gpu1", "gpu_util_pct"])
    assert any(row[util] is not None for row in payload["samples"]["values"])


def test_a_node_whose_exporter_is_down_at_start_keeps_its_rows(cluster: PrometheusServer) -> None:
    """Its series went stale (a failed scrape), but Prometheus saw them minutes ago."""
    cluster.farm.down = {2}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            up = cluster.query('up{instance="node-02:9400"}', time.time())
            if up and up[0]["value"][1] == "0":
                break
            time.sleep(0.2)
        backend = PrometheusBackend(cluster.url, '{job="dcgm"}', lag_s=0.0)
        assert len(backend.gpus) == NODES * GPUS
        states = backend.sample()
    finally:
        cluster.farm.down = set()
        backend.close()
    hosts = [g.host for g in backend.gpus]
    down = [s for s, h in zip(states, hosts, strict=True) if h == "node-02"]
    assert all("no recent sample of node-02" in s.gpu_util_pct.reason for s in down)
    assert all(s.gpu_util_pct.ok for s, h in zip(states, hosts, strict=True) if h != "node-02")
