"""Where the monitor's rows come from: GPUs through a probe backend, the host, or a recording.

A feed has a fixed list of devices and series (device x metric) and returns one ``Frame``
per ``read()``: one pass over every device, one timestamp, NaN plus a reason for N/A.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpudiag.errors import GpuDiagError
from gpudiag.monitoring.derived import (
    bandwidth_estimate,
    peak_memory_bandwidth,
    ratio_pct,
    throttle_reasons,
)
from gpudiag.monitoring.metrics import DeviceSpec, SeriesKey
from gpudiag.probe.backend import Backend, NullBackend
from gpudiag.probe.dcgm import ActivityCounters, DcgmExporterBackend, DcgmReader, GpuSetBackend
from gpudiag.probe.host_sampler import HostSampler
from gpudiag.probe.model import GpuInfo, GpuState
from gpudiag.probe.readings import Reading, Status
from gpudiag.probe.session_replay import SessionReplay

log = logging.getLogger("gpudiag.monitoring")

NaMap = dict[int, tuple[Status, str]]


@dataclass(frozen=True, slots=True)
class Frame:
    """One tick: a value per series (NaN when N/A), the reasons of the N/A ones, the active
    throttling reasons per device, and notes on how a value was obtained (e.g. "rough")."""

    timestamp: float
    values: np.ndarray
    na: NaMap = field(default_factory=dict)
    events: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    finished: bool = False


@runtime_checkable
class Feed(Protocol):
    label: str
    is_recording: bool
    notes: tuple[str, ...]
    devices: tuple[DeviceSpec, ...]
    series: tuple[SeriesKey, ...]

    def read(self) -> Frame: ...

    def close(self) -> None: ...


# -- activity counters ---------------------------------------------------------------------


class CounterSource(Protocol):
    label: str

    def read(self) -> tuple[ActivityCounters, ...]:
        """One ``ActivityCounters`` per GPU of the backend, in the backend's order."""
        ...

    def close(self) -> None: ...


class NoCounters:
    """No activity counters; every read says why."""

    label = "none"

    def __init__(self, count: int, reason: str, status: Status = Status.NOT_AVAILABLE) -> None:
        self._counters = (ActivityCounters.unavailable(status, reason),) * count
        self.reason = reason

    def read(self) -> tuple[ActivityCounters, ...]:
        return self._counters

    def close(self) -> None:
        return None


class ExporterCounters:
    """The ``DCGM_FI_PROF_*`` values of the same read (an exporter scrape, a Prometheus query)
    the backend's ``sample()`` made."""

    label = "dcgm-exporter"

    def __init__(self, backend: GpuSetBackend) -> None:
        self._backend = backend

    def read(self) -> tuple[ActivityCounters, ...]:
        return self._backend.activity()

    def close(self) -> None:
        return None


def _uuid_key(uuid: object) -> str:
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


class DcgmCounters:
    """A DCGM host engine's profiling fields, matched to the backend's GPUs by UUID."""

    label = "DCGM"

    def __init__(self, reader: DcgmReader, infos: Sequence[GpuInfo]) -> None:
        self._reader = reader
        self._uuids = [_uuid_key(i.uuid.get("")) for i in infos]

    def read(self) -> tuple[ActivityCounters, ...]:
        latest = self._reader.read()
        missing = ActivityCounters.unavailable(
            Status.NOT_FOUND, "DCGM does not list this GPU (matched by UUID)", "dcgm"
        )
        return tuple(latest.get(u, missing) for u in self._uuids)

    def close(self) -> None:
        self._reader.close()


class GpmCounters:
    """NVML GPM readers, one per GPU (N/A with the reason where GPM is not usable)."""

    label = "NVML GPM"

    def __init__(self, readers: Sequence[Any]) -> None:
        self._readers = list(readers)

    def read(self) -> tuple[ActivityCounters, ...]:
        out = []
        for r in self._readers:
            if isinstance(r, Reading):
                out.append(ActivityCounters.unavailable(r.status, r.reason, "nvml gpm"))
            else:
                out.append(r.read())
        return tuple(out)

    def close(self) -> None:
        for r in self._readers:
            if not isinstance(r, Reading):
                r.close()


def auto_counters(backend: Backend, infos: Sequence[GpuInfo]) -> CounterSource:
    """The best activity-counter source for ``backend``: the exporter's own fields, a DCGM
    host engine, NVML GPM (Hopper+), or none with the reasons each one failed."""
    n = len(infos)
    if isinstance(backend, GpuSetBackend):
        return ExporterCounters(backend)
    if backend.is_recording:
        return NoCounters(n, "this recording has no activity counters (SM active, tensor, DRAM)")
    reasons = []
    dcgm = DcgmReader.connect()
    if dcgm.ok and dcgm.value is not None:
        return DcgmCounters(dcgm.value, infos)
    reasons.append(f"DCGM: {dcgm.reason}")
    session = getattr(backend, "session", None)
    if session is not None:
        from gpudiag.probe.gpm import GpmReader

        readers: list[Any] = [GpmReader.open(session, info.index) for info in infos]
        opened = [r.value if r.ok else r for r in readers]
        if any(not isinstance(r, Reading) for r in opened):
            return GpmCounters(opened)
        first = readers[0] if readers else None
        if first is not None:
            reasons.append(f"NVML GPM: {first.reason}")
    reason = "no activity counters (" + "; ".join(reasons) + ")"
    return NoCounters(n, reason)


# -- GPUs ---------------------------------------------------------------------------------

GPU_METRICS: tuple[str, ...] = (
    "gpu_util_pct",
    "memory_util_pct",
    "memory_used_bytes",
    "memory_used_pct",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "power_w",
    "power_pct_of_limit",
    "temperature_c",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "gr_engine_active_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "memory_bandwidth_gbps",
    "memory_bandwidth_pct_of_peak",
    "throttled",
)
# What only DCGM reports per tick (exporters, Prometheus): errors a node's GPUs hit.
ERROR_METRICS: tuple[str, ...] = (
    "xid_last",
    "ecc_uncorrected_volatile",
    "remapped_rows_uncorrectable",
)


def select_devices(infos: Sequence[GpuInfo], devices: Sequence[int | str] | None) -> list[int]:
    """Positions in ``infos`` of the requested NVML indices or UUIDs (prefixes allowed)."""
    if devices is None:
        return list(range(len(infos)))
    positions: list[int] = []
    for want in devices:
        found = None
        for pos, info in enumerate(infos):
            if isinstance(want, int) and not isinstance(want, bool):
                if info.index == want:
                    found = pos
            elif _uuid_key(info.uuid.get("")).startswith(_uuid_key(want)) and str(want).strip():
                found = pos
            if found is not None:
                break
        if found is None:
            known = ", ".join(f"{i.index} ({i.uuid.get('no uuid')})" for i in infos) or "none"
            raise GpuDiagError(
                f"no GPU {want!r} to monitor; pass NVML indices or UUIDs of: {known} "
                "(NVML indices follow PCI order, not CUDA_VISIBLE_DEVICES)"
            )
        if found not in positions:
            positions.append(found)
    return positions


class GpuFeed:
    """GPU metrics from a probe backend plus activity counters and the derived metrics."""

    def __init__(
        self,
        backend: Backend,
        *,
        counters: CounterSource | None = None,
        devices: Sequence[int | str] | None = None,
        clock: Callable[[], float] = time.time,
        notes: tuple[str, ...] = (),
        metrics: tuple[str, ...] | None = None,
    ) -> None:
        self.backend = backend
        if metrics is None:
            spans_nodes = isinstance(backend, GpuSetBackend)
            metrics = GPU_METRICS + ERROR_METRICS if spans_nodes else GPU_METRICS
        self.metrics = metrics
        self._col = {m: i for i, m in enumerate(metrics)}
        self.label = backend.label
        self.is_recording = bool(backend.is_recording)
        self._clock = clock
        infos = backend.gpu_infos()
        self._positions = select_devices(infos, devices)
        self._infos = [infos[p] for p in self._positions]
        self.counters = counters if counters is not None else auto_counters(backend, infos)
        # Backends that span machines (dcgm-exporter URLs) name each GPU's host.
        hosts = [str(h) for h in (getattr(backend, "hosts", None) or ())]
        ids = [f"gpu{i.index}" for i in self._infos]
        chosen_hosts = {hosts[p] for p in self._positions} if hosts else set()
        prefix_host = len(chosen_hosts) > 1 or (bool(hosts) and len(set(ids)) != len(ids))
        devs = []
        seen: set[str] = set()
        self._peaks: list[float | None] = []
        for p, info in zip(self._positions, self._infos, strict=True):
            host = hosts[p] if hosts else ""
            dev_id = f"{host}/gpu{info.index}" if prefix_host else f"gpu{info.index}"
            if dev_id in seen:  # e.g. two MIG instances of one GPU behind an exporter
                dev_id = f"{dev_id}#{p}"
            seen.add(dev_id)
            name = str(info.name.get(""))
            label = f"GPU {info.index}" + (f" · {name}" if name else "")
            if prefix_host:
                label = f"{host} · {label}"
            peak, peak_source = peak_memory_bandwidth(info)
            self._peaks.append(peak)
            facts: dict[str, Any] = {
                "peak_memory_bandwidth_gbps": peak,
                "peak_memory_bandwidth_source": peak_source,
                "memory_total_bytes": info.memory_total_bytes.get(),
                "power_limit_w": info.power_limit_w.get(),
                "nvml_index": info.index,
            }
            devs.append(
                DeviceSpec(
                    id=dev_id,
                    label=label,
                    kind="gpu",
                    name=name,
                    uuid=str(info.uuid.get("")),
                    host=host,
                    facts=facts,
                )
            )
        self.devices = tuple(devs)
        self.series = tuple(SeriesKey(d.id, m) for d in self.devices for m in metrics)
        self.notes = (*notes, f"activity counters: {self.counters.label}")
        self._nvlink_prev: list[dict[str, float] | None] = [None] * len(self.devices)

    def read(self) -> Frame:
        now = self._clock()
        states = self.backend.sample()
        activity = self.counters.read()
        if isinstance(self.backend, GpuSetBackend) and self.backend.sample_time is not None:
            now = self.backend.sample_time  # Prometheus: the time the query was evaluated at
        return self._frame(now, states, activity)

    def history(self, span_s: float, step_s: float) -> tuple[list[Frame], str]:
        """Rows from before the monitor started, where the source keeps them (Prometheus):
        the frames and a note on what was read (or why nothing was)."""
        from gpudiag.probe.prometheus import PrometheusBackend

        if not isinstance(self.backend, PrometheusBackend) or span_s <= 0:
            return [], ""
        got = self.backend.history(span_s, step_s)
        if not got.ok or got.value is None:
            return [], f"no history from Prometheus: {got.reason}"
        frames = [self._frame(t, states, counters) for t, states, counters in got.value]
        span = frames[-1].timestamp - frames[0].timestamp if len(frames) > 1 else 0.0
        return frames, f"history: {len(frames)} rows over {span:.0f} s from a range query"

    def _frame(
        self, now: float, states: Sequence[GpuState], activity: Sequence[ActivityCounters]
    ) -> Frame:
        m = len(self.metrics)
        values = np.full(len(self.series), np.nan, dtype=np.float64)
        na: NaMap = {}
        notes: dict[int, str] = {}
        events: dict[str, tuple[str, ...]] = {}
        for k, (pos, dev) in enumerate(zip(self._positions, self.devices, strict=True)):
            base = k * m
            state = states[pos] if pos < len(states) else GpuState()
            act = activity[pos] if pos < len(activity) else ActivityCounters()
            self._fill_gpu(base, k, dev, state, act, now, values, na, notes, events)
        return Frame(timestamp=now, values=values, na=na, events=events, notes=notes)

    def _fill_gpu(
        self,
        base: int,
        k: int,
        dev: DeviceSpec,
        state: GpuState,
        act: ActivityCounters,
        now: float,
        values: np.ndarray,
        na: NaMap,
        notes: dict[int, str],
        events: dict[str, tuple[str, ...]],
    ) -> None:
        col = self._col

        def put(metric: str, reading: Reading[Any], scale: float = 1.0) -> float:
            if metric not in col:
                return math.nan
            i = base + col[metric]
            if reading.ok and reading.value is not None:
                try:
                    values[i] = float(reading.value) * scale
                    return float(values[i])
                except (TypeError, ValueError):
                    na[i] = (Status.UNKNOWN, f"not a number: {reading.value!r}")
                    return math.nan
            na[i] = (reading.status, reading.reason or reading.status.value)
            return math.nan

        def derived(metric: str, value: float, reason: tuple[Status, str]) -> None:
            i = base + col[metric]
            if math.isfinite(value):
                values[i] = value
            else:
                na[i] = reason

        def reason_of(metric: str) -> tuple[Status, str]:
            return na.get(base + col[metric], (Status.NOT_AVAILABLE, "not read"))

        put("gpu_util_pct", state.gpu_util_pct)
        mem_util = put("memory_util_pct", state.memory_util_pct)
        used = put("memory_used_bytes", state.memory_used_bytes)
        put("sm_clock_mhz", state.sm_clock_mhz)
        put("memory_clock_mhz", state.memory_clock_mhz)
        power = put("power_w", state.power_w)
        put("temperature_c", state.temperature_c)
        put("pcie_rx_bytes_per_s", state.pcie_rx_bytes_per_s)
        put("pcie_tx_bytes_per_s", state.pcie_tx_bytes_per_s)
        put("gr_engine_active_pct", act.gr_engine_active_pct)
        put("sm_active_pct", act.sm_active_pct)
        put("sm_occupancy_pct", act.sm_occupancy_pct)
        put("tensor_active_pct", act.tensor_active_pct)
        dram = put("dram_active_pct", act.dram_active_pct)
        put("xid_last", state.xid_last)
        put("ecc_uncorrected_volatile", state.ecc_uncorrected_volatile)
        put("remapped_rows_uncorrectable", state.remapped_rows_uncorrectable)

        total = dev.facts.get("memory_total_bytes")
        derived(
            "memory_used_pct",
            ratio_pct(used, total),
            reason_of("memory_used_bytes")
            if not math.isfinite(used)
            else (Status.NOT_AVAILABLE, "memory total unknown"),
        )
        limit = dev.facts.get("power_limit_w")
        derived(
            "power_pct_of_limit",
            ratio_pct(power, limit),
            reason_of("power_w")
            if not math.isfinite(power)
            else (Status.NOT_AVAILABLE, "power limit unknown (nvidia-smi -q -d POWER)"),
        )
        self._nvlink(base, k, state, act, now, values, na)

        peak = self._peaks[k]
        gbps, pct, basis = bandwidth_estimate(dram, mem_util, peak)
        if not math.isfinite(pct):
            reason = (
                Status.NOT_AVAILABLE,
                f"no DRAM-active counter ({reason_of('dram_active_pct')[1]}) and no "
                f"memory-controller utilization ({reason_of('memory_util_pct')[1]})",
            )
            derived("memory_bandwidth_gbps", math.nan, reason)
            derived("memory_bandwidth_pct_of_peak", math.nan, reason)
        else:
            derived(
                "memory_bandwidth_gbps",
                gbps,
                (Status.NOT_AVAILABLE, str(dev.facts.get("peak_memory_bandwidth_source"))),
            )
            derived("memory_bandwidth_pct_of_peak", pct, (Status.NOT_AVAILABLE, basis))
            for metric in ("memory_bandwidth_gbps", "memory_bandwidth_pct_of_peak"):
                notes[base + col[metric]] = basis

        reasons = state.clock_event_reasons
        if reasons.ok and reasons.value is not None:
            active = throttle_reasons(tuple(reasons.value))
            values[base + col["throttled"]] = 1.0 if active else 0.0
            if active:
                events[dev.id] = active
        else:
            na[base + col["throttled"]] = (reasons.status, reasons.reason or reasons.status.value)

    def _nvlink(
        self,
        base: int,
        k: int,
        state: GpuState,
        act: ActivityCounters,
        now: float,
        values: np.ndarray,
        na: NaMap,
    ) -> None:
        """NVLink rates: the counters' own rates when given, else the change of NVML's
        cumulative byte counters over the tick (N/A on the first tick)."""
        previous = self._nvlink_prev[k]
        current: dict[str, float] = {}
        for direction, rate, total in (
            ("rx", act.nvlink_rx_bytes_per_s, state.nvlink_rx_bytes),
            ("tx", act.nvlink_tx_bytes_per_s, state.nvlink_tx_bytes),
        ):
            i = base + self._col[f"nvlink_{direction}_bytes_per_s"]
            if rate.ok and rate.value is not None:
                values[i] = float(rate.value)
                continue
            if not total.ok or total.value is None:
                na[i] = (total.status, total.reason or total.status.value)
                continue
            current[direction] = float(total.value)
            before = previous.get(direction) if previous is not None else None
            if before is None or previous is None or now <= previous["t"]:
                na[i] = (Status.NOT_AVAILABLE, "a rate needs two samples")
            elif current[direction] < before:
                # A counter that went backwards was reset (driver reload): skip one tick.
                na[i] = (Status.NOT_AVAILABLE, "NVLink counters were reset")
            else:
                values[i] = (current[direction] - before) / (now - previous["t"])
        if current:
            current["t"] = now
            self._nvlink_prev[k] = current
        else:
            self._nvlink_prev[k] = None

    def close(self) -> None:
        try:
            self.counters.close()
        finally:
            self.backend.close()


# -- the host (no GPU) ----------------------------------------------------------------------


class HostFeed:
    """The host's CPU, memory and this process: the monitor's mode on a machine without GPUs."""

    is_recording = False

    def __init__(self, sampler: HostSampler | None = None, *, notes: tuple[str, ...] = ()) -> None:
        import socket

        self.sampler = sampler or HostSampler()
        self.label = "host (psutil)"
        self.notes = notes
        hostname = socket.gethostname()
        host = DeviceSpec(
            id="host", label=f"host · {hostname}", kind="host", name=hostname, host=hostname
        )
        self.devices: tuple[DeviceSpec, ...] = (host,)
        cores = self.sampler.core_count
        series = [SeriesKey("host", "cpu_util_pct")]
        series += [SeriesKey("host", "cpu_core_util_pct", str(c)) for c in range(cores)]
        series += [
            SeriesKey("host", m)
            for m in (
                "memory_used_bytes",
                "memory_used_pct",
                "process_rss_bytes",
                "process_threads",
                "process_cpu_pct",
            )
        ]
        self.series = tuple(series)
        self._cores = cores

    def read(self) -> Frame:
        s = self.sampler.sample()
        values = np.full(len(self.series), np.nan, dtype=np.float64)
        na: NaMap = {}

        def put(i: int, reading: Reading[Any]) -> None:
            if reading.ok and reading.value is not None:
                values[i] = float(reading.value)
            else:
                na[i] = (reading.status, reading.reason or reading.status.value)

        put(0, s.cpu_util_pct)
        cores = s.cpu_core_util_pct
        for c in range(self._cores):
            if cores.ok and cores.value is not None and c < len(cores.value):
                values[1 + c] = cores.value[c]
            else:
                na[1 + c] = (cores.status, cores.reason or "core not reported")
        base = 1 + self._cores
        readings: tuple[Reading[Any], ...] = (
            s.memory_used_bytes,
            s.memory_used_pct,
            s.process_rss_bytes,
            s.process_threads,
            s.process_cpu_pct,
        )
        for j, reading in enumerate(readings):
            put(base + j, reading)
        return Frame(timestamp=s.timestamp, values=values, na=na)

    def close(self) -> None:
        self.sampler.close()


# -- a recorded session ----------------------------------------------------------------------


class ReplayFeed:
    """A recorded session (``gpudiag.session`` JSON lines) played at real speed."""

    is_recording = True

    def __init__(
        self, replay: SessionReplay, *, devices: Sequence[int | str] | None = None
    ) -> None:
        self.replay = replay
        header = replay.recording.header
        self.label = replay.label
        notice = (header.notice,) if header.notice else ()
        self.notes = (f"recording: {header.recording}", *notice)
        all_devices = [DeviceSpec.from_dict(d) for d in header.devices]
        keep = _select_recorded(all_devices, devices)
        self.devices = tuple(d for d in all_devices if d.id in keep)
        all_series = [SeriesKey.from_list(s) for s in header.series]
        self._columns = np.array(
            [i for i, s in enumerate(all_series) if s.device in keep], dtype=np.intp
        )
        self._new_index = {int(old): new for new, old in enumerate(self._columns)}
        self.series = tuple(all_series[i] for i in self._columns)
        units = list(header.units) or [""] * len(all_series)
        self.units = tuple(units[i] for i in self._columns)
        self.interval_s = float(header.interval_s)

    def read(self) -> Frame:
        f = self.replay.read()
        remap = self._new_index
        return Frame(
            timestamp=f.timestamp,
            values=f.values[self._columns],
            na={remap[i]: v for i, v in f.na.items() if i in remap},
            events={d: r for d, r in f.events.items() if any(x.id == d for x in self.devices)},
            notes={remap[i]: v for i, v in f.notes.items() if i in remap},
            finished=f.finished,
        )

    def close(self) -> None:
        self.replay.close()


def _select_recorded(devices: Sequence[DeviceSpec], wanted: Sequence[int | str] | None) -> set[str]:
    """Device ids of a recording chosen by position, id, or UUID prefix."""
    if wanted is None:
        return {d.id for d in devices}
    keep: set[str] = set()
    for want in wanted:
        match = None
        for pos, d in enumerate(devices):
            if isinstance(want, int) and not isinstance(want, bool):
                match = d if pos == want else None
            elif str(want).strip() and (
                d.id == want or _uuid_key(d.uuid).startswith(_uuid_key(want))
            ):
                match = d
            if match is not None:
                break
        if match is None:
            known = ", ".join(f"{i} ({d.id})" for i, d in enumerate(devices)) or "none"
            raise GpuDiagError(
                f"no device {want!r} in this recording; pass positions, ids or UUIDs of: {known}"
            )
        keep.add(match.id)
    return keep


# -- choosing a feed ------------------------------------------------------------------------

DEMO_SESSION = "demo-cluster.session.jsonl"


def resolve_replay(replay: str | Path) -> Path:
    """A path, or the name of a recording shipped with gpudiag ("demo" is the demo session)."""
    text = str(replay)
    p = Path(text).expanduser()
    if p.is_file():
        return p
    from gpudiag.data import recording

    name = DEMO_SESSION if text in {"demo", "demo-cluster"} else text
    try:
        return recording(name)
    except GpuDiagError:
        raise GpuDiagError(
            f"no recording {text!r}: give a path to a gpudiag session (.jsonl, from "
            "Monitor.save), an `nvidia-smi -q -x` dump or a `gpudiag inspect --json` snapshot, "
            f"or a shipped name such as 'demo'"
        ) from None


def build_feed(
    *,
    replay: str | Path | None = None,
    exporters: Sequence[str] | None = None,
    prometheus: str | None = None,
    selector: str = "",
    backend: Backend | None = None,
    devices: Sequence[int | str] | None = None,
    counters: CounterSource | None = None,
    loop: bool = True,
) -> Feed:
    """The feed ``gd.monitor`` uses: a replay, a Prometheus server, dcgm-exporter URLs, a
    backend, live NVML, or, when no GPU can be seen, the host (with the reason no GPU was
    found)."""
    if replay is not None:
        from gpudiag.probe.session_replay import is_session_file

        path = resolve_replay(replay)
        if is_session_file(path):
            return ReplayFeed(SessionReplay.from_file(path, loop=loop), devices=devices)
        from gpudiag.probe.replay import ReplayBackend

        return GpuFeed(ReplayBackend.from_file(path), counters=counters, devices=devices)
    cluster: GpuSetBackend | None = None
    if prometheus is not None:
        from gpudiag.probe.prometheus import PrometheusBackend

        cluster = PrometheusBackend(prometheus, selector)
    elif exporters:
        cluster = DcgmExporterBackend(list(exporters))
    if cluster is not None:
        try:
            return GpuFeed(cluster, counters=counters, devices=devices)
        except Exception:
            cluster.close()
            raise
    if backend is None:
        try:
            from gpudiag.probe.backend import default_backend

            backend = default_backend(light=True)
        except ImportError as exc:  # the NVML layer is optional at this level
            backend = NullBackend(f"no NVIDIA GPU: NVML backend unavailable ({exc})")
    count = backend.gpu_count()
    if isinstance(backend, NullBackend) or not count.ok or not count.value:
        why = backend.reason if isinstance(backend, NullBackend) else count.reason or "0 GPUs"
        backend.close()
        return HostFeed(notes=(f"{why}: showing the host (CPU, memory, this process) instead",))
    return GpuFeed(backend, counters=counters, devices=devices)


__all__ = [
    "DEMO_SESSION",
    "ERROR_METRICS",
    "GPU_METRICS",
    "CounterSource",
    "DcgmCounters",
    "ExporterCounters",
    "Feed",
    "Frame",
    "GpmCounters",
    "GpuFeed",
    "HostFeed",
    "NoCounters",
    "ReplayFeed",
    "auto_counters",
    "build_feed",
    "resolve_replay",
    "select_devices",
]
