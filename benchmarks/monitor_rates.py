"""Sustained sampling rate of the host and replay feeds, and bytes sent to the browser per update.

    python benchmarks/monitor_rates.py [--seconds 3] [--interval 0.0001]

Part 1 runs the real sampler thread as fast as it can (a tiny interval) for each feed and
reports ticks per second, the wall-clock cost of a tick and the sampler's CPU time.
Part 2 attaches the live widget to a recorded session through a comm that only counts bytes,
ticks the monitor and pushes every ``--rows-per-push`` rows, and prints the bytes of one
update as the rows held grow from 10 to the whole 10-minute window: they must not grow. The
one-off backfill a new browser view asks for is shown next to it, for contrast.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import comm
from comm.base_comm import BaseComm

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import HostFeed, build_feed


class CountingComm(BaseComm):
    """A comm that sends nothing and counts the bytes it would send."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sizes: list[int] = []
        super().__init__(*args, **kwargs)

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        if msg_type == "comm_msg" and (data or {}).get("method") == "custom":
            import json

            self.sizes.append(len(json.dumps(data)) + sum(len(bytes(b)) for b in buffers or []))


def sampling_rate(name: str, make_feed: Any, seconds: float, interval: float) -> None:
    m = Monitor(make_feed(), interval=interval, history_s=60.0)
    time.sleep(seconds)
    m.stop()
    s = m.stats()
    rate = s["ticks"] / seconds
    print(
        f"{name:<8} {rate:>10.0f} ticks/s  {s['mean_tick_ms'] * 1e3:>8.1f} us/tick (wall)  "
        f"{1e6 * s['sampler_cpu_s'] / max(1.0, s['ticks']):>8.1f} us/tick (CPU)  "
        f"{len(m.series):>4} series"
    )


def bytes_per_update(rows_per_push: int) -> None:
    comm.create_comm = CountingComm  # type: ignore[assignment]
    from gpudiag.ui.monitor import MonitorChart

    feed = build_feed(replay="demo")
    m = Monitor(feed, interval=0.1, history_s=600.0, start=False)
    chart = MonitorChart(m, push_interval_s=3600.0)
    channel = chart.comm
    assert isinstance(channel, CountingComm)
    print(f"demo session: {len(m.series)} series, {rows_per_push} new rows per update")
    print(f"{'rows held':>10}  {'bytes/update':>12}  {'backfill bytes':>14}")
    held = 0
    for target in (10, 100, 1_000, 3_000, 6_000):
        while held < target:
            m.tick()
            held += 1
            if held % rows_per_push == 0:
                chart.push(force=True)
        update = channel.sizes[-1]
        chart.backfill()  # what a newly opened browser view would get once
        backfill = channel.sizes[-1]
        print(f"{held:>10}  {update:>12}  {backfill:>14}")
    chart.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=0.0001)
    parser.add_argument("--rows-per-push", type=int, default=3)
    args = parser.parse_args()
    print(
        "sustained sampling rate (sampler thread, interval "
        f"{args.interval * 1e3:g} ms, {args.seconds:g} s each)"
    )
    sampling_rate("host", HostFeed, args.seconds, args.interval)
    sampling_rate("replay", lambda: build_feed(replay="demo"), args.seconds, args.interval)
    print()
    bytes_per_update(args.rows_per_push)


if __name__ == "__main__":
    main()
