"""Soak: 10^6 samples through a fake GPU backend: flat memory, no thread left after stop().

    python benchmarks/monitor_soak.py [--samples 1000000] [--gpus 2]

The real sampler thread reads a GPU feed over a fake backend (scripted NVML-like states for
``--gpus`` GPUs, with activity counters) at a tiny interval until it has taken ``--samples``
ticks, with the live widget attached through a comm that only counts bytes. Every tenth of
the way it prints the process RSS, the number of live Python objects (``--trace`` adds
tracemalloc's traced memory, at about 3x the run time), the ring's rows and the bytes the last
widget update carried. After stop() it lists the threads still alive.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
import tracemalloc
from typing import Any

import comm
import psutil
from comm.base_comm import BaseComm

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import GpuFeed
from gpudiag.probe.dcgm import ActivityCounters
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState
from gpudiag.probe.readings import Reading, ok

GIB = 1 << 30


class FakeBackend:
    """NVML-shaped answers that change every sample (a busy, occasionally throttled GPU)."""

    label = "fake backend (soak)"
    is_recording = False

    def __init__(self, gpus: int) -> None:
        self.n = 0
        self.infos = tuple(
            GpuInfo(
                index=i,
                name=ok("Soak board"),
                uuid=ok(f"GPU-soak-{i}"),
                memory_total_bytes=ok(80 * GIB),
                memory_bus_width_bits=ok(5120),
                max_memory_clock_mhz=ok(1593),
                power_limit_w=ok(400.0),
            )
            for i in range(gpus)
        )

    def gpu_count(self) -> Reading[int]:
        return ok(len(self.infos))

    def driver(self) -> DriverInfo:
        return DriverInfo()

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return self.infos

    def sample(self) -> tuple[GpuState, ...]:
        self.n += 1
        k = self.n
        throttled = ("sw_power_cap",) if (k // 5000) % 7 == 0 else ("gpu_idle",)
        return tuple(
            GpuState(
                timestamp=time.time(),
                gpu_util_pct=ok(float(k % 100)),
                memory_util_pct=ok(float((k * 7) % 100)),
                memory_used_bytes=ok((k % 80) * GIB),
                sm_clock_mhz=ok(1410 - (k % 3) * 15),
                memory_clock_mhz=ok(1593),
                power_w=ok(250.0 + k % 150),
                temperature_c=ok(60.0 + k % 20),
                clock_event_reasons=ok(throttled),
                pcie_rx_bytes_per_s=ok(1e9),
                pcie_tx_bytes_per_s=ok(2e8),
                nvlink_rx_bytes=ok(k * 4096),
                nvlink_tx_bytes=ok(k * 2048),
            )
            for _ in self.infos
        )

    def close(self) -> None:
        return None


class FakeCounters:
    label = "fake counters"

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.n = 0

    def read(self) -> tuple[ActivityCounters, ...]:
        self.n += 1
        c = ActivityCounters(
            sm_active_pct=ok(float(self.n % 100)),
            sm_occupancy_pct=ok(40.0),
            tensor_active_pct=ok(55.0),
            dram_active_pct=ok(float((self.n * 3) % 100)),
        )
        return (c,) * self.gpus

    def close(self) -> None:
        return None


class CountingComm(BaseComm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_bytes = 0
        self.messages = 0
        super().__init__(*args, **kwargs)

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        if msg_type == "comm_msg":
            self.messages += 1
            self.last_bytes = sum(len(bytes(b)) for b in buffers or [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--rows", type=int, default=6000, help="ring rows (10 min at 10 Hz)")
    parser.add_argument("--trace", action="store_true", help="also report tracemalloc memory")
    args = parser.parse_args()

    comm.create_comm = CountingComm  # type: ignore[assignment]
    from gpudiag.ui.monitor import MonitorChart

    threads_before = {t.name for t in threading.enumerate()}
    if args.trace:
        tracemalloc.start()
    proc = psutil.Process()
    feed = GpuFeed(FakeBackend(args.gpus), counters=FakeCounters(args.gpus))
    # interval 1 us: as fast as the thread goes; the ring holds --rows rows.
    interval = 1e-6
    m = Monitor(feed, interval=interval, history_s=(args.rows - 1) * interval, start=False)
    chart = MonitorChart(m, push_interval_s=0.05)
    channel = chart.comm
    assert isinstance(channel, CountingComm)
    print(
        f"{args.gpus} fake GPUs, {len(m.series)} series, ring of {m.ring.capacity} rows "
        f"({m.ring.nbytes / 1e6:.1f} MB)"
    )
    print(
        f"{'samples':>9}  {'RSS MB':>7}  {'objects':>8}  {'traced MB':>9}  {'rows held':>9}  "
        f"{'update B':>8}  {'throttle log':>12}  {'s':>6}"
    )
    start = time.monotonic()
    m.start()
    step = args.samples // 10
    for mark in range(step, args.samples + 1, step):
        while m.ring.count < mark and m.running:
            time.sleep(0.02)
        gc.collect()
        traced = f"{tracemalloc.get_traced_memory()[0] / 1e6:.2f}" if args.trace else "-"
        print(
            f"{m.ring.count:>9}  {proc.memory_info().rss / 1e6:>7.1f}  "
            f"{len(gc.get_objects()):>8}  {traced:>9}  "
            f"{len(m.ring):>9}  {channel.last_bytes:>8}  {len(m.throttle_events()):>12}  "
            f"{time.monotonic() - start:>6.1f}"
        )
    m.stop()
    chart.close()
    time.sleep(0.1)
    left = [t.name for t in threading.enumerate() if t.name not in threads_before]
    stats = m.stats()
    print(
        f"stopped after {int(stats['ticks'])} samples in {time.monotonic() - start:.1f} s "
        f"({stats['mean_tick_ms'] * 1e3:.1f} us/tick); widget messages {channel.messages}; "
        f"state {m.state}; threads left: {left or 'none'}"
    )


if __name__ == "__main__":
    main()
