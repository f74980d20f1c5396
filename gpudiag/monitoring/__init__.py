"""Live monitoring: ``gd.monitor()`` samples GPUs (or the host, or a recording) in background."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.monitoring.sampler import (
    Monitor,
    MonitorSummary,
    ThrottleEvent,
    active,
    stop_active,
)

if TYPE_CHECKING:
    from gpudiag.monitoring.feeds import CounterSource
    from gpudiag.probe.backend import Backend


def _in_notebook_kernel() -> Any | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


LOCAL_INTERVAL_S = 0.1
# Prometheus and exporters refresh every few seconds (dcgm-exporter: 30 s by default).
CLUSTER_INTERVAL_S = 1.0


def monitor(
    interval: float | None = None,
    devices: Sequence[int | str] | None = None,
    display: bool = True,
    replay: str | Path | None = None,
    *,
    prometheus: str | None = None,
    selector: str = "",
    endpoints: Sequence[str] | None = None,
    exporters: Sequence[str] | None = None,
    history_s: float = 600.0,
    backend: Backend | None = None,
    counters: CounterSource | None = None,
    loop: bool = True,
) -> Monitor:
    """Start the background monitor and, in a notebook, show its live widget.

    - ``interval``: seconds between samples (default 0.1 = 10 Hz on this machine, 1 s for a
      cluster); one pass over every device per tick, one timestamp.
    - ``devices``: NVML indices or UUIDs to watch (default: all). NVML indices follow PCI
      order, not ``CUDA_VISIBLE_DEVICES``.
    - ``replay``: play a recording at real speed instead of live data: a session saved with
      ``Monitor.save``, an ``nvidia-smi -q -x`` dump, a ``gpudiag inspect --json``
      snapshot, or ``"demo"`` (a session assembled from real recordings, labelled so).
    - ``prometheus``: a Prometheus server's URL (``http://HOST:9090``) that scrapes
      dcgm-exporter on every node; ``selector`` picks the series (``'{job="dcgm"}'``). One
      row per node and GPU, read by PromQL (instant queries each tick, range queries for the
      history at start; ``m.feed.backend.query`` is the query, to check a value by hand).
    - ``endpoints``: dcgm-exporter URLs (``http://node:9400/metrics``) read directly, where
      no Prometheus runs. ``exporters`` is the same (its first name).
    - ``history_s``: seconds of samples kept in memory (a ring: memory stays constant).

    Without a visible NVIDIA GPU it samples the host (CPU per core, memory, this process)
    and says why. Calling it again (or re-running the cell) replaces the running monitor;
    ``m.stop()`` stops it (idempotent; it also runs at exit and when the widget closes).
    """
    from gpudiag.errors import ArgumentError
    from gpudiag.monitoring.feeds import build_feed
    from gpudiag.probe.dcgm import GpuSetBackend

    if endpoints is not None and exporters is not None:
        raise ArgumentError("give endpoints= or exporters= (the same thing), not both")
    urls = endpoints if endpoints is not None else exporters
    if prometheus is not None and urls:
        raise ArgumentError("give prometheus= or endpoints=, not both: Prometheus reads them")
    if interval is None:
        cluster = prometheus is not None or bool(urls) or isinstance(backend, GpuSetBackend)
        interval = CLUSTER_INTERVAL_S if cluster else LOCAL_INTERVAL_S
    feed = build_feed(
        replay=replay,
        exporters=urls,
        prometheus=prometheus,
        selector=selector,
        backend=backend,
        devices=devices,
        counters=counters,
        loop=loop,
    )
    try:
        m = Monitor(feed, interval=interval, history_s=history_s, start=False)
    except Exception:
        feed.close()
        raise
    m.start()
    shell = _in_notebook_kernel() if display else None
    if shell is not None:
        from IPython.display import display as show

        show(m.view())
        m.displayed_in = shell.execution_count
    return m


def stop() -> bool:
    """Stop the running monitor (``%gpudiag stop``); False when none was running."""
    return stop_active()


__all__ = ["Monitor", "MonitorSummary", "ThrottleEvent", "active", "monitor", "stop"]
