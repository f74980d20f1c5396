"""Which process holds which GPU memory and utilization on this machine (as nvitop shows).

NVML lists the processes with a context on each GPU (``nvmlDeviceGetComputeRunningProcesses``
and the graphics list), the memory each holds, and per-process SM and memory utilization
(``nvmlDeviceGetProcessUtilization``); psutil adds the host side (user, CPU, resident memory,
command line). The NVIDIA driver knows only the host's process ids: in a container that does
not share the host's PID namespace those ids name no process here (NVIDIA/nvidia-docker#1483),
so the rows say so, and a GPU whose memory is in use with no process listed says why.
Check by hand: ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv`` and
``nvidia-smi pmon -c 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Grid, Lines
from gpudiag.probe.backend import Backend, NullBackend
from gpudiag.probe.model import GpuInfo, GpuState
from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.units import GIB, format_bytes

_MIB = 1 << 20
CPU_WINDOW_S = 0.2
CONTAINER_REASON = (
    "not a process of this PID namespace: the NVIDIA driver reports the host's process ids, "
    "and this runs in a container that does not share them (docker run --pid=host, or "
    "hostPID: true in Kubernetes, shows them)"
)
# A GPU holding more than this with no process listed is hiding its processes from us.
UNLISTED_BYTES = 256 * _MIB


@dataclass(frozen=True, slots=True)
class HostProcess:
    """What the host says of one process (psutil)."""

    user: Reading[str]
    cpu_pct: Reading[float]
    rss_bytes: Reading[int]
    command: Reading[str]


@dataclass(frozen=True, slots=True)
class GpuProcessRow:
    """One process on one GPU: what NVML says of it on the GPU, and what the host says."""

    gpu: int
    pid: int
    name: str
    kind: str
    gpu_memory_bytes: Reading[int]
    sm_util_pct: Reading[float]
    memory_util_pct: Reading[float]
    host: HostProcess

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "pid": self.pid,
            "name": self.name,
            "kind": self.kind,
            "gpu_memory_bytes": self.gpu_memory_bytes.to_dict(),
            "sm_util_pct": self.sm_util_pct.to_dict(),
            "memory_util_pct": self.memory_util_pct.to_dict(),
            "user": self.host.user.to_dict(),
            "cpu_pct": self.host.cpu_pct.to_dict(),
            "rss_bytes": self.host.rss_bytes.to_dict(),
            "command": self.host.command.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU: its memory in use, how much of it the listed processes account for, and why
    the rest is not accounted for when it is large."""

    index: int
    name: str
    memory_used_bytes: Reading[int]
    memory_total_bytes: Reading[int]
    gpu_util_pct: Reading[float]
    listed_bytes: int
    note: str = ""


@dataclass(frozen=True)
class ProcessReport(Carded):
    """The GPU processes of this machine (or of a recording), one row per process and GPU."""

    source: str
    is_recording: bool
    gpus: tuple[GpuUse, ...]
    rows: tuple[GpuProcessRow, ...]
    notes: tuple[str, ...] = ()
    taken_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "is_recording": self.is_recording,
            "taken_at": self.taken_at,
            "gpus": [jsonable(g) for g in self.gpus],
            "rows": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }

    def _table(self) -> tuple[list[str], list[list[str]]]:
        header = ["GPU", "PID", "user", "GPU mem", "SM %", "mem %", "CPU %", "host mem", "command"]
        rows = []
        for r in self.rows:
            command = r.host.command.get(None) or r.name or "?"
            rows.append(
                [
                    str(r.gpu),
                    str(r.pid),
                    str(r.host.user.get("N/A")),
                    _bytes(r.gpu_memory_bytes),
                    _pct(r.sm_util_pct),
                    _pct(r.memory_util_pct),
                    _pct(r.host.cpu_pct),
                    _bytes(r.host.rss_bytes),
                    str(command)[:80],
                ]
            )
        return header, rows

    def _lines_below(self) -> list[str]:
        lines = []
        noted: dict[str, list[int]] = {}
        for g in self.gpus:
            used = _bytes(g.memory_used_bytes)
            total = _bytes(g.memory_total_bytes)
            lines.append(
                f"GPU {g.index} {g.name}: {used} of {total} used, {_pct(g.gpu_util_pct)} % "
                f"busy; listed processes hold {g.listed_bytes / (1 << 30):.2f} GiB"
            )
            if g.note:
                noted.setdefault(g.note, []).append(g.index)
        for note, indices in noted.items():
            lines.append(f"GPU {', '.join(map(str, indices))}: {note}")
        hidden = sorted({r.pid for r in self.rows if r.host.command.status is Status.NOT_FOUND})
        if hidden:
            lines.append(f"pids {', '.join(map(str, hidden))}: {CONTAINER_REASON}")
        lines.extend(self.notes)
        return lines

    def _title(self) -> str:
        kind = " (recording)" if self.is_recording else ""
        return f"GPU processes: {self.source}{kind}"

    def __repr__(self) -> str:
        header, rows = self._table()
        out = [self._title()]
        if rows:
            widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
            for row in (header, *rows):
                out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        else:
            out.append("no GPU process listed")
        out.extend(self._lines_below())
        return "\n".join(line.rstrip() for line in out)

    def as_card(self) -> Card:
        header, rows = self._table()
        table = Grid(header, rows) if rows else Lines(["no GPU process listed"])
        return Card(self._title(), [table, Lines(self._lines_below(), "note")])


def _bytes(r: Reading[Any]) -> str:
    if not r.ok or r.value is None:
        return "N/A"
    value = float(r.value)
    if value >= GIB:
        return format_bytes(value, ".2f", unit="GiB")
    return format_bytes(value, ".0f", unit="MiB")


def _pct(r: Reading[Any]) -> str:
    return f"{float(r.value):.0f}" if r.ok and r.value is not None else "N/A"


# -- the host side (psutil) ---------------------------------------------------------------

HostLookup = Callable[[Sequence[int]], dict[int, HostProcess]]


def psutil_lookup(pids: Sequence[int], window_s: float = CPU_WINDOW_S) -> dict[int, HostProcess]:
    """User, CPU share over ``window_s``, resident memory and command line of each pid; a pid
    that names no process here is N/A with ``CONTAINER_REASON``."""
    try:
        import psutil
    except ImportError:
        missing = na(Status.NOT_FOUND, "psutil is not installed (pip install psutil)", "psutil")
        return {pid: HostProcess(missing, missing, missing, missing) for pid in pids}
    procs: dict[int, Any] = {}
    before: dict[int, float] = {}
    out: dict[int, HostProcess] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            times = p.cpu_times()
            procs[pid], before[pid] = p, times.user + times.system
        except psutil.NoSuchProcess:
            gone = na(Status.NOT_FOUND, CONTAINER_REASON, "psutil")
            out[pid] = HostProcess(gone, gone, gone, gone)
        except psutil.AccessDenied as exc:
            denied = na(Status.NO_PERMISSION, f"the host refused: {exc}", "psutil")
            out[pid] = HostProcess(denied, denied, denied, denied)
    started = time.monotonic()
    if procs:
        time.sleep(window_s)
    elapsed = max(time.monotonic() - started, 1e-6)
    for pid, p in procs.items():
        try:
            with p.oneshot():
                times = p.cpu_times()
                cpu = 100.0 * (times.user + times.system - before[pid]) / elapsed
                user = ok(str(p.username()), "psutil")
                rss = ok(int(p.memory_info().rss), "psutil")
                command = ok(" ".join(p.cmdline()) or p.name(), "psutil")
            out[pid] = HostProcess(user, ok(cpu, "psutil"), rss, command)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            gone = na(Status.NOT_AVAILABLE, f"ended or refused while read: {exc}", "psutil")
            out[pid] = HostProcess(gone, gone, gone, gone)
    return out


# -- NVML per-process utilization ----------------------------------------------------------


def process_utilization(
    session: NvmlSession, index: int
) -> Reading[dict[int, tuple[float, float]]]:
    """pid -> (SM %, memory %) over the driver's last sampling window
    (``nvmlDeviceGetProcessUtilization``; ``nvidia-smi pmon -c 1``). No samples since the
    last window (NVML_ERROR_NOT_FOUND) means no process ran a kernel: an empty map."""
    handle = session.handle(index)
    if not handle.ok:
        return na(handle.status, handle.reason, "nvml")
    got = session.call("nvmlDeviceGetProcessUtilization", handle.value, 0)
    if not got.ok:
        if got.status is Status.NOT_FOUND:
            return ok({}, "nvml")
        return na(got.status, got.reason, "nvml")
    latest: dict[int, tuple[float, float, float]] = {}
    for sample in got.value or ():
        pid = int(sample.pid)
        stamp = float(sample.timeStamp)
        if pid not in latest or stamp >= latest[pid][0]:
            latest[pid] = (stamp, float(sample.smUtil), float(sample.memUtil))
    return ok({pid: (sm, mem) for pid, (_, sm, mem) in latest.items()}, "nvml")


def _util_reading(
    utils: Reading[dict[int, tuple[float, float]]], pid: int, which: int
) -> Reading[float]:
    if not utils.ok or utils.value is None:
        return na(utils.status, utils.reason, utils.source)
    value = utils.value.get(pid)
    return ok(value[which] if value is not None else 0.0, "nvml")


def gpu_processes(
    backend: Backend | None = None,
    *,
    session: NvmlSession | None = None,
    lookup: HostLookup | None = None,
) -> ProcessReport:
    """The processes on every GPU the backend sees (default: NVML on this machine).

    ``session`` is the NVML session to ask for per-process utilization (the live backend's
    own by default; none for a recording: N/A with that reason). ``lookup`` gives the host
    side of each pid (default: psutil on this machine; a recording has no host side).
    """
    if backend is None:
        from gpudiag.probe.backend import default_backend

        backend = default_backend()
    if session is None:
        session = getattr(backend, "session", None)  # the live NVML backend's session
    if isinstance(backend, NullBackend):
        return ProcessReport("this machine", False, (), (), (f"no GPU: {backend.reason}",))
    infos = backend.gpu_infos()
    states = backend.sample()
    recorded = bool(backend.is_recording)
    pids = sorted({p.pid for s in states for p in (s.processes.get(None) or ())})
    if recorded:
        absent = na(Status.NOT_AVAILABLE, "a recording holds no host side", "replay")
        hosts = {pid: HostProcess(absent, absent, absent, absent) for pid in pids}
    else:
        hosts = (lookup or psutil_lookup)(pids)
    rows: list[GpuProcessRow] = []
    gpus: list[GpuUse] = []
    for info, state in zip(infos, states, strict=False):
        if session is not None:
            utils = process_utilization(session, info.index)
        else:
            utils = na(Status.NOT_AVAILABLE, "per-process utilization needs live NVML", "")
        procs = state.processes
        listed = 0
        for p in procs.get(None) or ():
            listed += int(p.used_memory_bytes.get(0) or 0)
            rows.append(
                GpuProcessRow(
                    gpu=info.index,
                    pid=p.pid,
                    name=p.name,
                    kind=p.kind,
                    gpu_memory_bytes=p.used_memory_bytes,
                    sm_util_pct=_util_reading(utils, p.pid, 0),
                    memory_util_pct=_util_reading(utils, p.pid, 1),
                    host=hosts[p.pid],
                )
            )
        gpus.append(_gpu_use(info, state, listed))
    return ProcessReport(backend.label, recorded, tuple(gpus), tuple(rows))


def _gpu_use(info: GpuInfo, state: GpuState, listed: int) -> GpuUse:
    used = state.memory_used_bytes
    note = ""
    if not state.processes.ok:
        note = f"no process list: {state.processes.reason}"
    elif used.ok and int(used.value or 0) - listed > UNLISTED_BYTES:
        if not state.processes.value:
            note = (
                "memory in use but no process listed: the processes run in another PID "
                "namespace (another container, or the host seen from a container); docker run "
                "--pid=host, or hostPID: true in Kubernetes, shows them"
            )
        else:
            note = "more memory in use than the listed processes hold (other containers)"
    return GpuUse(
        index=info.index,
        name=str(info.name.get("")),
        memory_used_bytes=used,
        memory_total_bytes=info.memory_total_bytes,
        gpu_util_pct=state.gpu_util_pct,
        listed_bytes=listed,
        note=note,
    )


def processes(replay: str | None = None) -> ProcessReport:
    """``gd.processes()``: the processes on this machine's GPUs with their GPU memory, SM and
    memory utilization, user, CPU, host memory and command line (as nvitop shows); or those
    of a recording (``replay=`` an ``nvidia-smi -q -x`` dump or ``nvidia-smi`` text)."""
    if replay is None:
        return gpu_processes()
    from gpudiag.probe.replay import ReplayBackend

    return gpu_processes(ReplayBackend.from_file(replay))


__all__ = [
    "CONTAINER_REASON",
    "GpuProcessRow",
    "GpuUse",
    "HostProcess",
    "ProcessReport",
    "gpu_processes",
    "process_utilization",
    "processes",
    "psutil_lookup",
]
