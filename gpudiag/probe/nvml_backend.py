"""The live backend: GPU facts and states read through the NVML chokepoint."""

from __future__ import annotations

import time
from typing import Any

from gpudiag.probe.model import (
    DriverInfo,
    GpuInfo,
    GpuProcess,
    GpuState,
    MigInstance,
    NvLink,
    PcieLink,
)
from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.probe.topology import Topology
from gpudiag.probe.topology_nvml import from_nvml

# Bit -> name, in nvidia-smi's spelling (``clocks_event_reason_<name>`` in ``nvidia-smi -q -x``).
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)

_ARCHITECTURES = {
    "NVML_DEVICE_ARCH_KEPLER": "Kepler",
    "NVML_DEVICE_ARCH_MAXWELL": "Maxwell",
    "NVML_DEVICE_ARCH_PASCAL": "Pascal",
    "NVML_DEVICE_ARCH_VOLTA": "Volta",
    "NVML_DEVICE_ARCH_TURING": "Turing",
    "NVML_DEVICE_ARCH_AMPERE": "Ampere",
    "NVML_DEVICE_ARCH_ADA": "Ada Lovelace",
    "NVML_DEVICE_ARCH_HOPPER": "Hopper",
    "NVML_DEVICE_ARCH_BLACKWELL": "Blackwell",
}

_VIRTUALIZATION = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}

MIG_UTILIZATION_REASON = (
    "MIG mode: NVML has no utilization for a MIG-enabled GPU or its instances; "
    "use DCGM profiling fields (DCGM_FI_PROF_GR_ENGINE_ACTIVE) per MIG instance"
)


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_EVENT_REASONS if mask & bit)


def _map(reading: Reading[Any], fn: Any) -> Reading[Any]:
    """Apply ``fn`` to an OK reading's value, keeping the N/A reason otherwise."""
    if not reading.ok:
        return reading
    try:
        return ok(fn(reading.value), reading.source)
    except (TypeError, ValueError, AttributeError) as exc:
        return na(Status.UNKNOWN, f"unexpected value from NVML: {exc}", reading.source)


class NvmlBackend:
    """Reads every GPU NVML can see. Static facts are read once; ``sample`` reads state."""

    is_recording = False
    label = "NVML"

    def __init__(
        self,
        session: NvmlSession | None = None,
        *,
        pcie_throughput: bool = True,
        light: bool = False,
    ) -> None:
        self.session = session or NvmlSession.shared()
        # nvmlDeviceGetPcieThroughput blocks ~20 ms per call and GPU: a 10 Hz monitor of an
        # 8-GPU node cannot afford it. ``light`` also skips the slow-changing health fields
        # (processes, ECC, retired pages), which a one-off report still reads.
        self.pcie_throughput = pcie_throughput and not light
        self.light = light
        self._infos: tuple[GpuInfo, ...] | None = None
        self._handles: dict[int, Reading[Any]] = {}
        self._topology: tuple[Topology | None] | None = None

    # -- Backend protocol ---------------------------------------------------------------
    def gpu_count(self) -> Reading[int]:
        return self.session.device_count()

    def driver(self) -> DriverInfo:
        s = self.session
        cuda = _map(
            s.call("nvmlSystemGetCudaDriverVersion"), lambda v: f"{v // 1000}.{v % 1000 // 10}"
        )
        return DriverInfo(
            driver_version=s.call("nvmlSystemGetDriverVersion"),
            cuda_driver_version=cuda,
            nvml_version=s.call("nvmlSystemGetNVMLVersion"),
        )

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        if self._infos is None:
            count = self.gpu_count()
            self._infos = tuple(self._read_info(i) for i in range(count.get(0)))
        return self._infos

    def sample(self) -> tuple[GpuState, ...]:
        now = time.time()
        return tuple(self._read_state(info, now) for info in self.gpu_infos())

    def close(self) -> None:
        """Nothing to release: the shared session lives as long as the process."""

    def topology(self) -> Topology | None:
        """How the GPUs connect (read once); None with fewer than two GPUs."""
        if self._topology is None:
            infos = self.gpu_infos()
            if len(infos) < 2:
                self._topology = (None,)
            else:
                handles = [self._handle(i.index) for i in infos]
                found = from_nvml(self.session, [h.value if h.ok else None for h in handles])
                self._topology = (found,)
        return self._topology[0]

    # -- reading ------------------------------------------------------------------------
    def _handle(self, index: int) -> Reading[Any]:
        if index not in self._handles or not self._handles[index].ok:
            self._handles[index] = self.session.handle(index)
        return self._handles[index]

    def _read_info(self, index: int) -> GpuInfo:
        handle = self._handle(index)
        if not handle.ok:
            # e.g. GPU lost at handle time: one entry that says why everything is missing.
            missing = na(handle.status, handle.reason, "nvml")
            return GpuInfo(index=index, name=missing, uuid=missing, pci_bus_id=missing)
        h = handle.value
        s = self.session
        clock_sm = s.const("NVML_CLOCK_SM", 1)
        clock_mem = s.const("NVML_CLOCK_MEM", 2)
        mig_mode = s.call("nvmlDeviceGetMigMode", h)
        mig_enabled = _map(mig_mode, lambda v: bool(v[0]))
        return GpuInfo(
            index=index,
            name=s.call("nvmlDeviceGetName", h),
            uuid=s.call("nvmlDeviceGetUUID", h),
            pci_bus_id=_map(s.call("nvmlDeviceGetPciInfo", h), _pci_bus_id),
            architecture=_map(s.call("nvmlDeviceGetArchitecture", h), self._arch_name),
            compute_capability=_map(s.call("nvmlDeviceGetCudaComputeCapability", h), tuple),
            sm_count=self._sm_count(h),
            memory_total_bytes=_map(self._memory(h), lambda m: int(m.total)),
            memory_bus_width_bits=s.call("nvmlDeviceGetMemoryBusWidth", h),
            max_sm_clock_mhz=s.call("nvmlDeviceGetMaxClockInfo", h, clock_sm),
            max_memory_clock_mhz=s.call("nvmlDeviceGetMaxClockInfo", h, clock_mem),
            power_limit_w=_map(s.call("nvmlDeviceGetEnforcedPowerLimit", h), lambda mw: mw / 1000),
            requested_power_limit_w=_map(
                s.call("nvmlDeviceGetPowerManagementLimit", h), lambda mw: mw / 1000
            ),
            default_power_limit_w=_map(
                s.call("nvmlDeviceGetPowerManagementDefaultLimit", h), lambda mw: mw / 1000
            ),
            persistence_mode=_map(s.call("nvmlDeviceGetPersistenceMode", h), bool),
            ecc_enabled=_map(s.call("nvmlDeviceGetEccMode", h), lambda v: bool(v[0])),
            mig_enabled=mig_enabled,
            mig_instances=self._mig_instances(h) if mig_enabled.get(False) else (),
            pcie=PcieLink(
                gen_current=s.call("nvmlDeviceGetCurrPcieLinkGeneration", h),
                gen_max=s.call("nvmlDeviceGetMaxPcieLinkGeneration", h),
                width_current=s.call("nvmlDeviceGetCurrPcieLinkWidth", h),
                width_max=s.call("nvmlDeviceGetMaxPcieLinkWidth", h),
            ),
            nvlinks=self._nvlinks(h),
            virtualization=_map(
                s.call("nvmlDeviceGetVirtualizationMode", h),
                lambda v: _VIRTUALIZATION.get(v, str(v)),
            ),
        )

    def _arch_name(self, code: int) -> str:
        for const, name in _ARCHITECTURES.items():
            if self.session.const(const) == code:
                return name
        return f"unknown ({code})"

    def _memory(self, h: Any) -> Reading[Any]:
        # v2 separates memory the driver reserves from "used", as nvidia-smi shows it.
        v2 = self.session.const("nvmlMemory_v2")
        if v2 is not None:
            reading = self.session.call("nvmlDeviceGetMemoryInfo", h, version=v2)
            if reading.ok or reading.status is not Status.DRIVER_TOO_OLD:
                return reading
        return self.session.call("nvmlDeviceGetMemoryInfo", h)

    def _sm_count(self, h: Any) -> Reading[int]:
        attrs: Any = self.session.call("nvmlDeviceGetAttributes", h).get(None)
        if getattr(attrs, "multiprocessorCount", 0):
            return ok(int(attrs.multiprocessorCount), "nvml")
        return na(
            Status.NOT_SUPPORTED,
            "NVML gives SM counts only for MIG devices on this driver; see the spec table",
            "nvml",
        )

    def _mig_instances(self, h: Any) -> tuple[MigInstance, ...]:
        s = self.session
        count = s.call("nvmlDeviceGetMaxMigDeviceCount", h)
        out: list[MigInstance] = []
        for i in range(count.get(0)):
            mh = s.call("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
            if not mh.ok:
                continue  # an empty slot answers NOT_FOUND
            m = mh.value
            attrs = s.call("nvmlDeviceGetAttributes", m)
            memory = self._memory(m)
            out.append(
                MigInstance(
                    index=len(out),
                    uuid=s.call("nvmlDeviceGetUUID", m),
                    gpu_instance_id=s.call("nvmlDeviceGetGpuInstanceId", m),
                    compute_instance_id=s.call("nvmlDeviceGetComputeInstanceId", m),
                    sm_count=_map(attrs, lambda a: int(a.multiprocessorCount)),
                    memory_total_bytes=_map(memory, lambda v: int(v.total)),
                    memory_used_bytes=_map(memory, lambda v: int(v.used)),
                )
            )
        return tuple(out)

    def _nvlinks(self, h: Any) -> tuple[NvLink, ...]:
        s = self.session
        links = []
        for link in range(int(s.const("NVML_NVLINK_MAX_LINKS", 18))):
            state = s.call("nvmlDeviceGetNvLinkState", h, link)
            if not state.ok:
                if state.status in (Status.NOT_SUPPORTED, Status.NOT_FOUND, Status.UNKNOWN):
                    break  # no NVLink, or past the last link
                links.append(NvLink(link=link, active=state))
                continue
            links.append(
                NvLink(
                    link=link,
                    active=ok(bool(state.value), "nvml"),
                    version=s.call("nvmlDeviceGetNvLinkVersion", h, link),
                    remote_pci_bus_id=_map(
                        s.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link), _pci_bus_id
                    ),
                )
            )
        return tuple(links)

    def _read_state(self, info: GpuInfo, timestamp: float) -> GpuState:
        handle = self._handle(info.index)
        if not handle.ok:
            missing = na(handle.status, handle.reason, "nvml")
            return GpuState(timestamp=timestamp, gpu_util_pct=missing, memory_used_bytes=missing)
        h = handle.value
        s = self.session
        if info.mig_enabled.get(False):
            mig = na(Status.NOT_AVAILABLE, MIG_UTILIZATION_REASON, "nvml")
            gpu_util, mem_util = mig, mig
        else:
            util = s.call("nvmlDeviceGetUtilizationRates", h)
            gpu_util = _map(util, lambda u: float(u.gpu))
            mem_util = _map(util, lambda u: float(u.memory))
        skipped = na(Status.NOT_AVAILABLE, "not sampled in light mode (read by gd.inspect)", "nvml")
        reasons = s.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons.status is Status.DRIVER_TOO_OLD:
            reasons = s.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return GpuState(
            timestamp=timestamp,
            gpu_util_pct=gpu_util,
            memory_util_pct=mem_util,
            memory_used_bytes=_map(self._memory(h), lambda m: int(m.used)),
            sm_clock_mhz=s.call("nvmlDeviceGetClockInfo", h, s.const("NVML_CLOCK_SM", 1)),
            memory_clock_mhz=s.call("nvmlDeviceGetClockInfo", h, s.const("NVML_CLOCK_MEM", 2)),
            power_w=_map(s.call("nvmlDeviceGetPowerUsage", h), lambda mw: mw / 1000),
            temperature_c=_map(
                s.call("nvmlDeviceGetTemperature", h, s.const("NVML_TEMPERATURE_GPU", 0)), float
            ),
            performance_state=_map(
                s.call("nvmlDeviceGetPerformanceState", h),
                lambda p: f"P{p}" if 0 <= p <= 15 else "unknown",
            ),
            clock_event_reasons=_map(reasons, decode_clock_event_reasons),
            pcie_rx_bytes_per_s=self._pcie(h, "NVML_PCIE_UTIL_RX_BYTES", 1),
            pcie_tx_bytes_per_s=self._pcie(h, "NVML_PCIE_UTIL_TX_BYTES", 0),
            nvlink_rx_bytes=self._nvlink_bytes(
                h, info, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139
            ),
            nvlink_tx_bytes=self._nvlink_bytes(
                h, info, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138
            ),
            ecc_uncorrected_volatile=skipped
            if self.light
            else s.call(
                "nvmlDeviceGetTotalEccErrors",
                h,
                s.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                s.const("NVML_VOLATILE_ECC", 0),
            ),
            retired_pages=skipped if self.light else self._retired_pages(h),
            **self._row_remapping(h, skipped),
            processes=skipped if self.light else self._processes(h),
        )

    def _row_remapping(self, h: Any, skipped: Reading[Any]) -> dict[str, Reading[Any]]:
        """nvmlDeviceGetRemappedRows -> (correctable rows, uncorrectable rows, pending,
        failure occurred), one call for the three readings."""
        names = ("remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed")
        if self.light:
            return dict.fromkeys(names, skipped)
        rows = self.session.call("nvmlDeviceGetRemappedRows", h)
        if not rows.ok:
            return dict.fromkeys(names, rows)
        remapped: Any = rows.get(())
        _, uncorrectable, pending, failed = remapped
        return {
            names[0]: ok(int(uncorrectable), "nvml"),
            names[1]: ok(bool(pending), "nvml"),
            names[2]: ok(bool(failed), "nvml"),
        }

    def _pcie(self, h: Any, const: str, default: int) -> Reading[float]:
        if not self.pcie_throughput:
            return na(Status.NOT_AVAILABLE, "PCIe throughput sampling switched off", "nvml")
        counter = self.session.const(const, default)
        # NVML reports KB/s (1024 bytes), averaged over a 20 ms window.
        return _map(
            self.session.call("nvmlDeviceGetPcieThroughput", h, counter), lambda v: v * 1024.0
        )

    def _nvlink_bytes(self, h: Any, info: GpuInfo, const: str, default: int) -> Reading[int]:
        if not info.nvlinks:
            return na(Status.NOT_SUPPORTED, "no NVLink on this GPU", "nvml")
        field_id = self.session.const(const, default)
        values = self.session.call("nvmlDeviceGetFieldValues", h, [field_id])
        if not values.ok:
            return values
        fields: Any = values.get(())
        value = fields[0]
        if getattr(value, "nvmlReturn", 0) != 0:
            return na(Status.NOT_SUPPORTED, "NVLink throughput counter not readable", "nvml")
        # The field is cumulative, in KiB.
        return ok(int(value.value.ullVal) * 1024, "nvml")

    def _retired_pages(self, h: Any) -> Reading[int]:
        total = 0
        for cause in (0, 1):  # multiple single-bit ECC, double-bit ECC
            pages = self.session.call("nvmlDeviceGetRetiredPages", h, cause)
            if not pages.ok:
                return pages
            total += len(pages.get(()))
        return ok(total, "nvml")

    def _processes(self, h: Any) -> Reading[tuple[GpuProcess, ...]]:
        s = self.session
        compute = s.call("nvmlDeviceGetComputeRunningProcesses", h)
        graphics = s.call("nvmlDeviceGetGraphicsRunningProcesses", h)
        if not compute.ok and not graphics.ok:
            return na(compute.status, compute.reason, "nvml")
        kinds: dict[int, tuple[str, Any]] = {}
        for kind, reading in (("compute", compute), ("graphics", graphics)):
            for p in reading.get(()) or ():
                pid = int(p.pid)
                previous = kinds.get(pid)
                label = "compute+graphics" if previous and previous[0] != kind else kind
                kinds[pid] = (label, p)
        procs = []
        for pid, (kind, p) in sorted(kinds.items()):
            used = getattr(p, "usedGpuMemory", None)
            name = s.call("nvmlSystemGetProcessName", pid)
            procs.append(
                GpuProcess(
                    pid=pid,
                    name=str(name.get("")),
                    kind=kind,
                    used_memory_bytes=ok(int(used), "nvml")
                    if used is not None
                    else na(Status.NOT_AVAILABLE, "not reported (e.g. Windows WDDM)", "nvml"),
                )
            )
        return ok(tuple(procs), "nvml")


def _pci_bus_id(pci: Any) -> str:
    bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", "")
    if isinstance(bus, bytes):
        bus = bus.decode("ascii", errors="replace")
    return str(bus).rstrip("\x00").upper()
