"""Samples the host (CPU per core, memory, this process): what the monitor shows without a GPU."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpudiag.probe.readings import Reading, Status, na, ok

SOURCE = "psutil"


def _missing(reason: str) -> Reading[Any]:
    return na(Status.NOT_FOUND, reason, SOURCE)


@dataclass(frozen=True, slots=True)
class HostSample:
    """One reading of the host; every field shares ``timestamp`` (seconds since the epoch).

    Utilizations are the share of time since the previous sample (``top``'s %CPU), so the
    first sample of a sampler reads 0 %. ``process_*`` describe the Python process that runs
    the sampler (the notebook kernel), threads included.
    """

    timestamp: float
    cpu_util_pct: Reading[float] = field(default_factory=lambda: _missing("not read"))
    cpu_core_util_pct: Reading[tuple[float, ...]] = field(
        default_factory=lambda: _missing("not read")
    )
    memory_used_bytes: Reading[int] = field(default_factory=lambda: _missing("not read"))
    memory_total_bytes: Reading[int] = field(default_factory=lambda: _missing("not read"))
    memory_used_pct: Reading[float] = field(default_factory=lambda: _missing("not read"))
    process_rss_bytes: Reading[int] = field(default_factory=lambda: _missing("not read"))
    process_threads: Reading[int] = field(default_factory=lambda: _missing("not read"))
    process_cpu_pct: Reading[float] = field(default_factory=lambda: _missing("not read"))


class HostSampler:
    """Reads the host with psutil; one ``sample()`` is one pass with one timestamp.

    Costs about 0.1 ms per sample (it reads ``/proc`` on Linux). Without psutil every field
    is N/A with the reason (``pip install psutil``).
    """

    label = "host"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._psutil: Any | None = None
        self._process: Any | None = None
        self._problem: str | None = None
        try:
            import psutil
        except ImportError as exc:
            self._problem = f"psutil is not installed ({exc}): pip install psutil"
            return
        self._psutil = psutil
        self._process = psutil.Process(os.getpid())
        # psutil's CPU percentages measure from the previous call: prime both counters.
        psutil.cpu_percent(percpu=True)
        self._process.cpu_percent()

    @property
    def core_count(self) -> int:
        if self._psutil is None:
            return 0
        return int(self._psutil.cpu_count(logical=True) or 0)

    def sample(self) -> HostSample:
        now = self._clock()
        if self._psutil is None:
            missing = _missing(self._problem or "psutil unavailable")
            return HostSample(
                timestamp=now,
                cpu_util_pct=missing,
                cpu_core_util_pct=missing,
                memory_used_bytes=missing,
                memory_total_bytes=missing,
                memory_used_pct=missing,
                process_rss_bytes=missing,
                process_threads=missing,
                process_cpu_pct=missing,
            )
        ps = self._psutil
        cores = tuple(float(c) for c in ps.cpu_percent(percpu=True))
        total = sum(cores) / len(cores) if cores else 0.0
        memory = ps.virtual_memory()
        proc = self._process
        assert proc is not None
        try:
            with proc.oneshot():
                rss: Reading[int] = ok(int(proc.memory_info().rss), SOURCE)
                threads: Reading[int] = ok(int(proc.num_threads()), SOURCE)
                proc_cpu: Reading[float] = ok(float(proc.cpu_percent()), SOURCE)
        except ps.Error as exc:  # e.g. AccessDenied inside a locked-down container
            reason = f"cannot read this process: {type(exc).__name__}: {exc}"
            rss = threads = proc_cpu = na(Status.NO_PERMISSION, reason, SOURCE)
        # "used" as ``free`` shows it: total minus what the kernel could hand out now.
        used = int(memory.total - memory.available)
        return HostSample(
            timestamp=now,
            cpu_util_pct=ok(total, SOURCE),
            cpu_core_util_pct=ok(cores, SOURCE),
            memory_used_bytes=ok(used, SOURCE),
            memory_total_bytes=ok(int(memory.total), SOURCE),
            memory_used_pct=ok(100.0 * used / memory.total if memory.total else 0.0, SOURCE),
            process_rss_bytes=rss,
            process_threads=threads,
            process_cpu_pct=proc_cpu,
        )

    def close(self) -> None:
        return None


__all__ = ["HostSample", "HostSampler"]
