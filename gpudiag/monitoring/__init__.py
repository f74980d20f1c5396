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


def monitor(
    interval: float = 0.1,
    devices: Sequence[int | str] | None = None,
    display: bool = True,
    replay: str | Path | None = None,
    *,
    exporters: Sequence[str] | None = None,
    history_s: float = 600.0,
    backend: Backend | None = None,
    counters: CounterSource | None = None,
    loop: bool = True,
) -> Monitor:
    """Start the background monitor and, in a notebook, show its live widget.

    - ``interval``: seconds between samples (0.1 = 10 Hz); one pass over every device per
      tick, one timestamp.
    - ``devices``: NVML indices or UUIDs to watch (default: all). NVML indices follow PCI
      order, not ``CUDA_VISIBLE_DEVICES``.
    - ``replay``: play a recording at real speed instead of live data: a session saved with
      ``Monitor.save``, an ``nvidia-smi -q -x`` dump, a ``gpudiag inspect --json``
      snapshot, or ``"demo"`` (a session assembled from real recordings, labelled so).
    - ``exporters``: dcgm-exporter URLs (``http://node:9400/metrics``) to watch a cluster's
      GPUs, hardware activity counters included, from one notebook.
    - ``history_s``: seconds of samples kept in memory (a ring: memory stays constant).

    Without a visible NVIDIA GPU it samples the host (CPU per core, memory, this process)
    and says why. Calling it again (or re-running the cell) replaces the running monitor;
    ``m.stop()`` stops it (idempotent; it also runs at exit and when the widget closes).
    """
    from gpudiag.monitoring.feeds import build_feed

    feed = build_feed(
        replay=replay,
        exporters=exporters,
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
