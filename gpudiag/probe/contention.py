"""How busy the machine was while a measurement ran: other processes, other threads, CPU steal.

A CPU timing is only as good as the CPUs it had. Between two ``snapshot()`` calls this reads,
through psutil (``/proc/stat`` and ``/proc/self/task`` on Linux):

- ``others_cpus``: CPUs that other processes kept busy on average (the busy time of the CPUs
  this process may run on, minus this process's own CPU time), in CPUs (1.0 = one CPU fully);
- ``threads_cpus``: CPUs this process's other Python threads used (a ``gd.monitor`` sampling
  at 1 kHz beside a comparison, a data-loading thread), which the measured step competed with;
- ``steal_share``: the share of CPU time the hypervisor gave to other guests (``steal``);
- ``load_average``: the 1-minute load average at the end (it counts this process too).

``MachineLoad.busy`` says whether that contention was enough to move a timing: other work of
at least ``BUSY_SHARE`` of the CPUs this process may use (and at least ``BUSY_MIN_CPUS``), or
``BUSY_STEAL`` of steal. Readings psutil cannot give are None, never 0.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from gpudiag.probe.host import usable_cpus

BUSY_SHARE = 0.25
BUSY_MIN_CPUS = 0.5
BUSY_STEAL = 0.05


@dataclass(frozen=True)
class _Snapshot:
    wall_s: float
    busy_s: float | None  # the whole machine's busy CPU seconds
    total_s: float | None
    steal_s: float | None
    own_s: float | None  # this process's CPU seconds
    threads_s: dict[int, float] | None  # CPU seconds of this process's other Python threads


def _python_threads_cpu(psutil: object, me: int | None) -> dict[int, float] | None:
    ids = {
        t.native_id for t in threading.enumerate() if t.native_id is not None and t.native_id != me
    }
    try:
        threads = psutil.Process().threads()  # type: ignore[attr-defined]
    except Exception:
        return None
    return {t.id: t.user_time + t.system_time for t in threads if t.id in ids}


def snapshot() -> _Snapshot:
    """The counters now (psutil; None where it cannot read them)."""
    wall = time.monotonic()
    try:
        import psutil
    except ImportError:
        return _Snapshot(wall, None, None, None, None, None)
    try:
        per_cpu = psutil.cpu_times(percpu=True)
        try:  # only the CPUs this process may run on: the others are not contention
            allowed = os.sched_getaffinity(0)
            per_cpu = [t for i, t in enumerate(per_cpu) if i in allowed] or per_cpu
        except (AttributeError, OSError):
            pass
        total = idle = steal = 0.0
        has_steal = False
        for times in per_cpu:
            fields = times._asdict()
            # guest time is already counted in user time on Linux
            total += sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
            idle += fields.get("idle", 0.0) + fields.get("iowait", 0.0)
            if "steal" in fields:
                has_steal = True
                steal += fields["steal"]
        busy = total - idle - steal
        own = sum(psutil.Process().cpu_times()[:2])
    except Exception:
        return _Snapshot(wall, None, None, None, None, None)
    threads = _python_threads_cpu(psutil, threading.current_thread().native_id)
    return _Snapshot(wall, busy, total, steal if has_steal else None, own, threads)


@dataclass(frozen=True)
class MachineLoad:
    """Contention over one window (see the module docstring); ``busy`` and ``reasons()``."""

    seconds: float
    cpus: int
    others_cpus: float | None
    threads_cpus: float | None
    steal_share: float | None
    load_average: float | None

    @property
    def competing_cpus(self) -> float | None:
        """CPUs of other work the measured code competed with (processes and threads)."""
        parts = [x for x in (self.others_cpus, self.threads_cpus) if x is not None]
        return sum(parts) if parts else None

    @property
    def busy(self) -> bool:
        return bool(self.reasons())

    def reasons(self) -> list[str]:
        out = []
        competing = self.competing_cpus
        if competing is not None and competing >= max(BUSY_MIN_CPUS, BUSY_SHARE * self.cpus):
            who = []
            if self.others_cpus is not None and self.others_cpus >= 0.05:
                who.append(f"other processes {self.others_cpus:.1f}")
            if self.threads_cpus is not None and self.threads_cpus >= 0.05:
                who.append(f"this process's other threads {self.threads_cpus:.1f}")
            out.append(
                f"other work kept {competing:.1f} of the {self.cpus} CPUs this process may use "
                f"busy ({', '.join(who)})"
            )
        if self.steal_share is not None and self.steal_share >= BUSY_STEAL:
            out.append(f"the hypervisor took {self.steal_share:.0%} of the CPU time (steal)")
        return out

    def describe(self) -> str:
        parts = [
            f"{self.seconds:.1f} s",
            "other processes "
            + ("n/a" if self.others_cpus is None else f"{self.others_cpus:.2f} CPUs"),
            "other threads here "
            + ("n/a" if self.threads_cpus is None else f"{self.threads_cpus:.2f} CPUs"),
            "steal " + ("n/a" if self.steal_share is None else f"{self.steal_share:.1%}"),
            "load " + ("n/a" if self.load_average is None else f"{self.load_average:.2f}"),
            f"of {self.cpus} usable CPUs",
        ]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "cpus": self.cpus,
            "others_cpus": self.others_cpus,
            "threads_cpus": self.threads_cpus,
            "steal_share": self.steal_share,
            "load_average": self.load_average,
            "busy": self.busy,
            "reasons": self.reasons(),
        }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def between(start: _Snapshot, end: _Snapshot) -> MachineLoad:
    """The contention between two snapshots."""
    seconds = max(end.wall_s - start.wall_s, 1e-9)
    busy, own = _delta(start.busy_s, end.busy_s), _delta(start.own_s, end.own_s)
    others = None if busy is None or own is None else max(0.0, busy - own) / seconds
    threads = None
    if start.threads_s is not None and end.threads_s is not None:
        # per thread: one started during the window counts from zero, one that ended is gone
        threads = sum(
            max(0.0, cpu - start.threads_s.get(tid, 0.0)) for tid, cpu in end.threads_s.items()
        )
    total, steal = _delta(start.total_s, end.total_s), _delta(start.steal_s, end.steal_s)
    try:
        load: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    return MachineLoad(
        seconds=seconds,
        cpus=usable_cpus(),
        others_cpus=others,
        threads_cpus=None if threads is None else threads / seconds,
        steal_share=None if not total or steal is None else steal / total,
        load_average=load,
    )


__all__ = ["BUSY_MIN_CPUS", "BUSY_SHARE", "BUSY_STEAL", "MachineLoad", "between", "snapshot"]
