"""``gd.inspect()``: one report of the host, the GPUs (live or recorded), the driver and torch."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudiag import _measured
from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.errors import ReplayError
from gpudiag.probe import cuda
from gpudiag.probe.backend import Backend, default_backend
from gpudiag.probe.cuda_map import match_cuda_indices
from gpudiag.probe.host import probe_host
from gpudiag.probe.model import DriverInfo, Gpu, GpuInfo, HostInfo, record_from_dict
from gpudiag.probe.readings import Reading, ok
from gpudiag.probe.replay import SNAPSHOT_FORMAT, SNAPSHOT_VERSION, ReplayBackend
from gpudiag.probe.topology import Topology, load_topology
from gpudiag.units import format_bytes


def _mib(reading: Reading[Any], *, short: bool = False) -> str:
    if reading.ok:
        return format_bytes(reading.get(0), ",.0f", unit="MiB")
    return "N/A" if short else reading.display()


def _program(command: str) -> str:
    """The program's file name from a process command line (POSIX or Windows path)."""
    first = command.split(" ")[0] if command else ""
    return re.split(r"[\\/]", first)[-1] or "?"


def _gib(reading: Reading[Any]) -> str:
    return format_bytes(reading.get(0), ".1f", unit="GiB") if reading.ok else reading.display()


def enrich_from_specs(info: GpuInfo) -> GpuInfo:
    """Fill facts NVML or nvidia-smi did not give (compute capability, SMs, bus width) from
    the spec table, marking their source as "specs"; values that were read stay as they are."""
    if not info.name.ok:
        return info
    from gpudiag import specs

    spec = specs.lookup_gpu(str(info.name.value))
    if spec is None:
        return info
    updates: dict[str, Any] = {}
    for name, value in (
        ("compute_capability", tuple(spec.compute_capability)),
        ("sm_count", spec.sm_count),
        ("memory_bus_width_bits", spec.memory_bus_width_bits),
        ("architecture", spec.architecture),
    ):
        if not getattr(info, name).ok and value is not None:
            updates[name] = ok(value, "specs")
    return dataclasses.replace(info, **updates) if updates else info


@dataclass(frozen=True, slots=True)
class SystemReport:
    """Everything ``gd.inspect()`` found. ``source`` is "live" or "recording"."""

    host: HostInfo
    gpus: tuple[Gpu, ...]
    driver: DriverInfo
    gpu_count: Reading[int]
    source: str = "live"
    label: str = ""
    recorded_at: str = ""
    cuda_mapping: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    # How the GPUs connect; None with fewer than two GPUs or when nothing recorded it.
    topology: Topology | None = None

    # -- questions other layers ask -------------------------------------------------------
    @property
    def is_recording(self) -> bool:
        return self.source == "recording"

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def cuda_gpus(self) -> tuple[Gpu, ...]:
        """GPUs torch can use, in CUDA index order."""
        visible = [g for g in self.gpus if g.info.cuda_index is not None]
        return tuple(sorted(visible, key=lambda g: g.info.cuda_index or 0))

    @property
    def primary_gpu(self) -> Gpu | None:
        """``cuda:0`` when known, else the first GPU."""
        return (self.cuda_gpus or self.gpus or (None,))[0]

    @property
    def cpu_bf16_speed(self) -> Any | None:
        """This process's measured bf16/fp32 matmul speed (``gpudiag.bench.cpu_bf16``: its
        ``answer``, ratio and interval), the one the precision advice reads; None before
        anything measured it, and for a recording (its CPU is not this one)."""
        if self.is_recording:
            return None
        return _measured.fact("cpu_bf16_speed")

    @property
    def workload_bf16_speed(self) -> Any | None:
        """The bf16/fp32 speed of the latest diagnosed workload's own matmuls, measured in
        this process (``gd.diagnose``'s precision advice read it); None before that, and for
        a recording. It times other products than ``cpu_bf16_speed`` (a square one), so its
        figure differs: a step's small products gain less from bf16."""
        if self.is_recording:
            return None
        return _measured.fact("workload_bf16_speed")

    def _bf16_speeds(self) -> list[str]:
        """Each bf16 measurement of this process, saying which product it timed."""
        out = []
        if self.cpu_bf16_speed is not None:
            out.append(str(self.cpu_bf16_speed))
        if self.workload_bf16_speed is not None:
            out.append(
                f"{self.workload_bf16_speed} [the diagnosed step's own products: "
                "small ones gain less than the square one]"
            )
        return out

    @property
    def no_gpu_reason(self) -> str:
        if self.gpus:
            return ""
        return self.gpu_count.reason or "no NVIDIA GPU: the driver sees 0 devices"

    # -- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; also the gpudiag snapshot format that ``--replay`` reads back."""
        out = {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        measured = {  # measured in this process, not read from the machine
            name: jsonable(speed)
            for name, speed in (
                ("cpu_bf16_speed", self.cpu_bf16_speed),
                ("workload_bf16_speed", self.workload_bf16_speed),
            )
            if speed is not None
        }
        if measured:
            out["measured"] = measured
        return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SystemReport:
        backend = ReplayBackend.from_snapshot(dict(data))
        host = record_from_dict(HostInfo, data["host"]) if "host" in data else HostInfo()
        return inspect(backend=backend, host=host)

    # -- presentation -------------------------------------------------------------------
    def header(self) -> str:
        if self.is_recording:
            when = f" (recorded {self.recorded_at})" if self.recorded_at else ""
            return f"RECORDING {self.label.removeprefix('recording: ')}{when}: not this machine"
        return f"live ({self.label})"

    def lines(self) -> list[str]:
        h = self.host
        t = h.torch
        out = [f"gpudiag inspect: {self.header()}"]
        if self.is_recording and not (h.cpu_model.ok or h.logical_cores.ok or t.version.ok):
            out.append("Host     not in the recording (nvidia-smi output holds only the GPUs)")
            out.extend(self._device_lines())
            return out
        cores = f"{h.logical_cores.get('?')} logical cores"
        if h.numa_nodes.ok:
            cores += f", {h.numa_nodes.value} NUMA node{'s' if h.numa_nodes.value != 1 else ''}"
        memory = _gib(h.memory_total_bytes)
        if h.memory_available_bytes.ok:
            memory += f" ({_gib(h.memory_available_bytes)} free)"
        out.append(f"Host     {h.cpu_model.get('unknown CPU')}, {cores}, {memory} RAM")
        if h.cpu_flags:
            bf16 = "yes" if h.cpu_bf16_instructions else "no"
            speeds = self._bf16_speeds()
            if h.cpu_bf16_instructions and not speeds:
                bf16 += ", speed not measured: gd.bench.cpu_bf16_speed()"
            out.append(f"         CPU flags: {' '.join(h.cpu_flags)} (bf16 instructions: {bf16})")
            out += [f"         {speed}" for speed in speeds]
        if t.version.ok:
            out.append(
                f"Torch    {t.version.value} ({t.build} build), {t.num_threads.get('?')} threads, "
                f"CUDA available: {'yes' if t.cuda_available.get(False) else 'no'}"
            )
        else:
            out.append(f"Torch    {t.version.display()}")
        out.extend(self._device_lines())
        return out

    def _device_lines(self) -> list[str]:
        out = []
        d = self.driver
        if d.driver_version.ok or self.gpus:
            out.append(
                f"Driver   {d.driver_version.display()}, "
                f"CUDA (driver) {d.cuda_driver_version.display()}"
            )
        if not self.gpus:
            out.append(f"GPUs     {self.no_gpu_reason}")
        for gpu in self.gpus:
            out.extend(_gpu_lines(gpu))
        if self.cuda_mapping and self.gpus:
            out.append(f"CUDA indices matched by {self.cuda_mapping}")
        out.extend(self._topology_lines())
        out.extend(f"note: {n}" for n in self.notes)
        return out

    def _topology_lines(self) -> list[str]:
        if self.topology is not None:
            first, *rest = self.topology.lines()
            return [f"Topology {first} [{self.topology.source}]", *(f"         {r}" for r in rest)]
        if len(self.gpus) >= 2:
            return [f"Topology unknown: {_TOPOLOGY_HINT}"]
        return []

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _bf16_cell(self) -> str:
        speeds = self._bf16_speeds()
        if speeds:
            return "; ".join(speeds)
        if self.host.cpu_bf16_instructions:
            return "bf16 instructions; speed not measured: gd.bench.cpu_bf16_speed()"
        return "no bf16 instructions"

    def _driver_cell(self, reading: Reading[Any]) -> str:
        # Without a GPU the driver readings share the no-GPU reason, said once below the table.
        if not self.gpus and not reading.ok and reading.reason == self.no_gpu_reason:
            return "N/A: no GPU"
        return reading.display()

    def _repr_html_(self) -> str:
        h = self.host
        host_rows = [
            ("CPU", h.cpu_model.display()),
            ("cores", f"{h.logical_cores.display()} logical, {h.numa_nodes.display()} NUMA"),
            ("memory", f"{_gib(h.memory_total_bytes)} ({_gib(h.memory_available_bytes)} free)"),
            ("ML CPU flags", " ".join(h.cpu_flags) or "none"),
            ("bf16 speed", self._bf16_cell()),
            ("torch", f"{h.torch.version.display()} ({h.torch.build})"),
        ]
        if self.is_recording and not (h.cpu_model.ok or h.logical_cores.ok or h.torch.version.ok):
            host_rows = [("host", "not in the recording (nvidia-smi output holds only the GPUs)")]
        host_rows += [
            ("driver", self._driver_cell(self.driver.driver_version)),
            ("CUDA (driver)", self._driver_cell(self.driver.cuda_driver_version)),
        ]
        inner = html_table(host_rows, caption="Host")
        if self.gpus:
            header = [
                "GPU",
                "cuda",
                "name",
                "cc",
                "SMs",
                "memory",
                "util",
                "power",
                "temp",
                "PCIe",
                "notes",
            ]
            inner += html_grid(header, (_gpu_row(g) for g in self.gpus))
        else:
            reason = self.no_gpu_reason.removeprefix("no NVIDIA GPU: ")
            inner += f"<p><b>No NVIDIA GPU:</b> {esc(reason)}</p>"
        inner += _topology_html(self.topology, len(self.gpus))
        for note in self.notes:
            inner += f"<p style='opacity:.8'>note: {esc(note)}</p>"
        return card("gpudiag inspect", inner, subtitle=self.header())


_TOPOLOGY_HINT = (
    "record `nvidia-smi topo -m > topo.txt` on the machine and pass it with "
    "gd.inspect(replay=..., topology='topo.txt') or `gpudiag inspect --topology topo.txt`"
)


def _topology_html(topology: Topology | None, gpu_count: int) -> str:
    if topology is None:
        if gpu_count < 2:
            return ""
        return f"<p><b>Topology</b> unknown: {esc(_TOPOLOGY_HINT)}</p>"
    out = f"<p><b>Topology</b> {esc(topology.summary())} <i>({esc(topology.source)})</i></p>"
    if topology.links:
        names = [g.name for g in topology.gpus]
        rows = [
            [
                g.name,
                *(topology.links[i][j] for j in range(len(names))),
                g.cpu_affinity or "N/A",
                g.numa_affinity or "N/A",
            ]
            for i, g in enumerate(topology.gpus)
        ]
        grid = html_grid(["", *names, "CPU affinity", "NUMA"], rows)
        out += f"<details><summary>link matrix</summary>{grid}</details>"
    for line in topology.lines()[1:]:
        out += f"<div style='opacity:.8'>{esc(line)}</div>"
    return out


def _cc(gpu: Gpu) -> str:
    cc = gpu.compute_capability
    return f"{cc[0]}.{cc[1]}" if cc else "?"


def _pcie(info: GpuInfo) -> str:
    p = info.pcie
    if not p.gen_current.ok:
        return p.gen_current.display()
    return (
        f"gen {p.gen_current.value}/{p.gen_max.get('?')} "
        f"x{p.width_current.get('?')}/{p.width_max.get('?')}"
    )


def _flags(gpu: Gpu) -> list[str]:
    info, state = gpu.info, gpu.state
    notes = []
    if info.mig_enabled.get(False):
        notes.append(f"MIG on: {len(info.mig_instances)} instances")
    if info.persistence_mode.ok:
        notes.append(f"persistence {'on' if info.persistence_mode.value else 'off'}")
    if info.ecc_enabled.ok:
        notes.append(f"ECC {'on' if info.ecc_enabled.value else 'off'}")
    if info.virtualization.ok and info.virtualization.value not in ("none", ""):
        notes.append(f"virtualization: {info.virtualization.value}")
    reasons = state.clock_event_reasons.get(())
    if reasons:
        notes.append("clock events: " + ", ".join(reasons))
    return notes


def _memory(gpu: Gpu) -> str:
    used, total = gpu.state.memory_used_bytes, gpu.info.memory_total_bytes
    if used.ok and total.ok:
        return f"{_mib(used)} / {_gib(total)}"
    return f"{used.display()} / {_gib(total)}"


def _power(gpu: Gpu) -> str:
    power, limit = gpu.state.power_w, gpu.info.power_limit_w
    text = power.display("W", "{:.1f}")
    return f"{text} / {limit.value:.0f} W" if limit.ok else text


def _gpu_lines(gpu: Gpu) -> list[str]:
    info, state = gpu.info, gpu.state
    where = f" (cuda:{info.cuda_index})" if info.cuda_index is not None else ""
    sms = f"{info.sm_count.value} SMs" if info.sm_count.ok else "SMs ?"
    lines = [f"GPU {info.index}  {info.name.display()}{where}  cc {_cc(gpu)}  {sms}"]
    lines.append(
        f"  memory {_memory(gpu)}   util {state.gpu_util_pct.display('%', '{:.0f}')}   "
        f"power {_power(gpu)}   temp {state.temperature_c.display('C', '{:.0f}')}"
    )
    clocks = (state.sm_clock_mhz, info.max_sm_clock_mhz, state.memory_clock_mhz)
    lines.append(
        (
            f"  clocks SM {state.sm_clock_mhz.get('?')}/{info.max_sm_clock_mhz.get('?')} MHz, "
            f"memory {state.memory_clock_mhz.get('?')}/{info.max_memory_clock_mhz.get('?')} MHz   "
            if any(c.ok for c in clocks)
            else f"  clocks {state.sm_clock_mhz.display()}   "
        )
        + f"PCIe {_pcie(info)}   {state.performance_state.get('')}"
    )
    flags = _flags(gpu)
    if flags:
        lines.append("  " + "; ".join(flags))
    for mig in info.mig_instances:
        lines.append(
            f"  MIG {mig.index}: GI {mig.gpu_instance_id.get('?')} "
            f"CI {mig.compute_instance_id.get('?')}, "
            f"{mig.sm_count.get('?')} SMs, {_gib(mig.memory_total_bytes)}"
        )
    active = [n for n in info.nvlinks if n.active.get(False)]
    if info.nvlinks:
        lines.append(f"  NVLink: {len(active)}/{len(info.nvlinks)} links active")
    procs = state.processes.get(None)
    if procs:
        shown = ", ".join(
            f"{p.pid} {_program(p.name)} ({_mib(p.used_memory_bytes, short=True)})"
            for p in procs[:4]
        )
        more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
        lines.append(f"  processes: {shown}{more}")
    return lines


def _gpu_row(gpu: Gpu) -> list[str]:
    info, state = gpu.info, gpu.state
    return [
        str(info.index),
        "" if info.cuda_index is None else str(info.cuda_index),
        info.name.display(),
        _cc(gpu),
        str(info.sm_count.get("?")),
        _memory(gpu),
        state.gpu_util_pct.display("%", "{:.0f}"),
        _power(gpu),
        state.temperature_c.display("C", "{:.0f}"),
        _pcie(info),
        "; ".join(_flags(gpu)),
    ]


def inspect(
    replay: str | os.PathLike[str] | None = None,
    *,
    backend: Backend | None = None,
    host: HostInfo | None = None,
    env: Mapping[str, str] | None = None,
    topology: Topology | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
) -> SystemReport:
    """Report the host and the GPUs. Never raises for a missing driver, library or GPU.

    ``replay`` plays a recorded machine instead (``nvidia-smi -q -x`` XML, ``nvidia-smi -q`` or
    plain ``nvidia-smi`` text as pasted from a cluster, or a JSON snapshot from
    ``gpudiag inspect --json``); the report then says it is a recording.
    ``topology`` gives how the GPUs connect when the backend cannot tell (an XML recording):
    a ``Topology``, or the path(s) of recorded ``nvidia-smi topo -m`` and
    ``nvidia-smi topo -p2p r`` output of the same machine.
    """
    if backend is None:
        backend = ReplayBackend.from_file(replay) if replay is not None else default_backend()
    env = os.environ if env is None else env
    notes: list[str] = []
    if host is None:
        recorded_host = getattr(backend, "host", None)
        if recorded_host is not None:
            host = recorded_host
        elif backend.is_recording:
            # nvidia-smi output holds only the GPUs; this machine's CPU and torch are not the
            # recorded machine's, so they are not shown as if they were.
            host = HostInfo()
        else:
            host = probe_host()
    count = backend.gpu_count()
    infos = tuple(enrich_from_specs(i) for i in backend.gpu_infos())
    states = backend.sample()
    mapping_method = ""
    if infos and not backend.is_recording:
        torch_uuids = cuda.visible_uuids() if cuda.initialized() else None
        mapping = match_cuda_indices(infos, env=env, torch_uuids=torch_uuids)
        infos = tuple(
            dataclasses.replace(i, cuda_index=mapping.cuda_index.get(i.index)) for i in infos
        )
        mapping_method = mapping.method
        if mapping.note:
            notes.append(mapping.note)
    if backend.is_recording and infos and not any(i.cuda_index is not None for i in infos):
        # In a recording the GPUs were all visible to their own machine, in PCI order.
        infos = tuple(dataclasses.replace(i, cuda_index=n) for n, i in enumerate(infos))
        mapping_method = "pci order (as recorded)"
    bindings = getattr(getattr(backend, "session", None), "bindings_problem", None)
    if bindings:
        notes.append(bindings)
    found_topology = _topology(backend, topology, len(infos))
    return SystemReport(
        host=host,
        gpus=tuple(Gpu(info, state) for info, state in zip(infos, states, strict=False)),
        driver=backend.driver(),
        gpu_count=count,
        source="recording" if backend.is_recording else "live",
        label=backend.label,
        recorded_at=getattr(backend, "recorded_at", "")
        or ("" if backend.is_recording else _dt.datetime.now().isoformat(timespec="seconds")),
        cuda_mapping=mapping_method,
        notes=tuple(notes),
        topology=found_topology,
    )


def _topology(
    backend: Backend,
    given: Topology | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
    gpu_count: int,
) -> Topology | None:
    """The given topology (checked against the GPUs), else the backend's, if it has one."""
    if given is None:
        read = getattr(backend, "topology", None)
        found = read() if callable(read) else None
        return found if isinstance(found, Topology) and found.gpu_count >= 2 else None
    if isinstance(given, Topology):
        topology = given
    elif isinstance(given, (str, os.PathLike)):
        topology = load_topology(given)
    else:
        topology = load_topology(*given)
    if topology.gpu_count != gpu_count:
        raise ReplayError(
            f"the topology describes {topology.gpu_count} GPUs but the report has {gpu_count}: "
            "pass the `nvidia-smi -q -x` recording (replay=...) of the same machine"
        )
    return topology if gpu_count >= 2 else None
