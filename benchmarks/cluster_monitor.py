"""Load: a 64-node x 8-GPU job (512 simulated GPUs) through a real Prometheus for a minute at 1 s.

    python benchmarks/cluster_monitor.py [--nodes 64] [--gpus 8] [--duration 60] [--interval 1]

A local server serves each node's dcgm-exporter page (the recorded L4 scrape, copied per GPU,
values moving with time, tests/fakes/cluster.py); Debian's Prometheus (``/usr/bin/prometheus``)
scrapes all of them every second; ``gd.monitor(prometheus=...)`` reads them (its history from
range queries, then an instant query per tick) with the live widget attached in its node view
through a comm that only counts bytes. Every tenth of the way it prints the process RSS, the
ring's rows and bytes, and the widget's bytes per update; at the end the tick times (mean, max,
late ticks), the sampler's CPU time, the cost of one node-view projection, and how much the
RSS grew after the first tenth (the buffer is allocated at start: a bounded monitor stays flat).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import comm
import numpy as np
import psutil
from comm.base_comm import BaseComm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the cluster fakes live with the tests

from gpudiag.monitoring import monitor  # noqa: E402
from gpudiag.probe.prometheus import PrometheusBackend  # noqa: E402
from tests.fakes.cluster import PROMETHEUS, ExporterFarm, PrometheusServer  # noqa: E402

MIB = 1 << 20


class CountingComm(BaseComm):
    """A comm that keeps only the size of what it would send."""

    sent_bytes = 0
    messages = 0

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        CountingComm.messages += 1
        CountingComm.sent_bytes += sum(len(bytes(b)) for b in buffers or [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    if not Path(PROMETHEUS).is_file():
        print(f"skipped: {PROMETHEUS} not found (apt-get install -y prometheus)")
        return 0
    comm.create_comm = lambda *a, **k: CountingComm(*a, **k)
    proc = psutil.Process()
    farm = ExporterFarm(args.nodes, args.gpus, straggler=(args.nodes // 2, 3))
    work = Path(tempfile.mkdtemp(prefix="gpudiag-cluster-bench-"))
    server = PrometheusServer(farm, work)
    started = time.monotonic()
    server.start(scrapes=3, timeout_s=180)
    print(
        f"Prometheus up, {args.nodes} nodes x {args.gpus} GPUs scraped 3 times in "
        f"{time.monotonic() - started:.1f} s; one node's page: {len(farm.page(0)) / 1024:.0f} KiB"
    )
    try:
        backend = PrometheusBackend(server.url, '{job="dcgm"}', lag_s=1.0, timeout_s=5.0)
        m = monitor(backend=backend, interval=args.interval, display=False)
        from gpudiag.ui.monitor import MonitorChart

        chart = MonitorChart(m)  # the default view: one row per node past 16 GPUs
        print(
            f"devices {len(m.devices)}, series {len(m.series)}, ring {m.ring.capacity} rows x "
            f"{m.ring.width} ({m.ring.nbytes / MIB:.1f} MiB); widget view "
            f"'{chart.projection.name}': {chart.projection.width} series"
        )
        print(f"{'t (s)':>6} {'rows':>5} {'RSS MiB':>8} {'widget B/update':>16}")
        rss_first = None
        steps = 10
        last_bytes, last_messages = CountingComm.sent_bytes, CountingComm.messages
        for step in range(1, steps + 1):
            time.sleep(args.duration / steps)
            rss = proc.memory_info().rss / MIB
            rss_first = rss if rss_first is None else rss_first
            sent = CountingComm.sent_bytes - last_bytes
            msgs = max(1, CountingComm.messages - last_messages)
            last_bytes, last_messages = CountingComm.sent_bytes, CountingComm.messages
            print(
                f"{step * args.duration / steps:6.0f} {len(m.ring):5d} {rss:8.1f} "
                f"{sent / msgs:16.0f}"
            )
        m.stop()
        stats = m.stats()
        _, v = m.ring.last(1)
        t0 = time.perf_counter()
        for _ in range(20):
            chart.projection.apply(v)
        per_projection_ms = (time.perf_counter() - t0) / 20 * 1e3
        chart.close()
        history = next((n for n in m.notes if n.startswith("history")), "no history note")
        print(
            f"ticks {stats['ticks']:.0f}, mean tick {stats['mean_tick_ms']:.0f} ms, max "
            f"{stats['max_tick_ms']:.0f} ms, late ticks {stats['missed_ticks']:.0f}, sampler "
            f"CPU {stats['sampler_cpu_s']:.1f} s over {args.duration:.0f} s"
        )
        print(f"{history}; node-view projection of one row: {per_projection_ms:.2f} ms")
        rss_end = proc.memory_info().rss / MIB
        print(
            f"RSS after the first tenth {rss_first:.1f} MiB, at the end {rss_end:.1f} MiB "
            f"(+{rss_end - (rss_first or rss_end):.1f} MiB); ring {m.ring.nbytes / MIB:.1f} MiB"
        )
        finite = np.isfinite(v).mean()
        print(f"last row: {finite:.0%} of the series have a value (the rest: not exported)")
    finally:
        server.stop()
        farm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
