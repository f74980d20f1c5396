"""Plain frozen records of what the probe found: host, GPUs (facts and state), driver, torch."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gpudiag.probe.readings import Reading, Status, na

_MISSING = na(Status.NOT_AVAILABLE, "not read")


def _na() -> Reading[Any]:
    return _MISSING


@dataclass(frozen=True, slots=True)
class PcieLink:
    """PCIe link of a GPU: current vs maximum (an idle GPU may downclock its link).

    ``nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,``
    ``pcie.link.width.current,pcie.link.width.max``
    """

    gen_current: Reading[int] = field(default_factory=_na)
    gen_max: Reading[int] = field(default_factory=_na)
    width_current: Reading[int] = field(default_factory=_na)
    width_max: Reading[int] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink link (``nvidia-smi nvlink --status``)."""

    link: int
    active: Reading[bool] = field(default_factory=_na)
    version: Reading[int] = field(default_factory=_na)
    remote_pci_bus_id: Reading[str] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device carved out of a GPU (``nvidia-smi -L``)."""

    index: int
    uuid: Reading[str] = field(default_factory=_na)
    gpu_instance_id: Reading[int] = field(default_factory=_na)
    compute_instance_id: Reading[int] = field(default_factory=_na)
    sm_count: Reading[int] = field(default_factory=_na)
    memory_total_bytes: Reading[int] = field(default_factory=_na)
    memory_used_bytes: Reading[int] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a context on the GPU (``nvidia-smi --query-compute-apps``)."""

    pid: int
    name: str
    kind: str  # "compute", "graphics" or "compute+graphics"
    used_memory_bytes: Reading[int] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts of one physical GPU; they do not change while a job runs."""

    index: int  # NVML index (PCI order), NOT the CUDA index
    name: Reading[str] = field(default_factory=_na)
    uuid: Reading[str] = field(default_factory=_na)
    pci_bus_id: Reading[str] = field(default_factory=_na)
    architecture: Reading[str] = field(default_factory=_na)
    compute_capability: Reading[tuple[int, int]] = field(default_factory=_na)
    sm_count: Reading[int] = field(default_factory=_na)
    memory_total_bytes: Reading[int] = field(default_factory=_na)
    memory_bus_width_bits: Reading[int] = field(default_factory=_na)
    max_sm_clock_mhz: Reading[int] = field(default_factory=_na)
    max_memory_clock_mhz: Reading[int] = field(default_factory=_na)
    power_limit_w: Reading[float] = field(default_factory=_na)
    # The board's default limit (`nvidia-smi --query-gpu=power.default_limit`): an enforced
    # limit below it was lowered by an admin, a tool, or a shared budget (GH200 module).
    default_power_limit_w: Reading[float] = field(default_factory=_na)
    # The limit asked for (`nvidia-smi -pl`, NVML's power management limit): an enforced limit
    # below it comes from another budget (module, chassis), which `nvidia-smi -pl` cannot lift.
    requested_power_limit_w: Reading[float] = field(default_factory=_na)
    persistence_mode: Reading[bool] = field(default_factory=_na)
    ecc_enabled: Reading[bool] = field(default_factory=_na)
    mig_enabled: Reading[bool] = field(default_factory=_na)
    mig_instances: tuple[MigInstance, ...] = ()
    pcie: PcieLink = field(default_factory=PcieLink)
    nvlinks: tuple[NvLink, ...] = ()
    virtualization: Reading[str] = field(default_factory=_na)
    cuda_index: int | None = None  # torch/CUDA index, matched by UUID; None when not visible


@dataclass(frozen=True, slots=True)
class GpuState:
    """What one GPU is doing at one instant; every field shares ``timestamp``."""

    timestamp: float = 0.0
    gpu_util_pct: Reading[float] = field(default_factory=_na)
    memory_util_pct: Reading[float] = field(default_factory=_na)
    memory_used_bytes: Reading[int] = field(default_factory=_na)
    sm_clock_mhz: Reading[int] = field(default_factory=_na)
    memory_clock_mhz: Reading[int] = field(default_factory=_na)
    power_w: Reading[float] = field(default_factory=_na)
    temperature_c: Reading[float] = field(default_factory=_na)
    performance_state: Reading[str] = field(default_factory=_na)
    clock_event_reasons: Reading[tuple[str, ...]] = field(default_factory=_na)
    pcie_rx_bytes_per_s: Reading[float] = field(default_factory=_na)
    pcie_tx_bytes_per_s: Reading[float] = field(default_factory=_na)
    nvlink_rx_bytes: Reading[int] = field(default_factory=_na)  # cumulative counters
    nvlink_tx_bytes: Reading[int] = field(default_factory=_na)
    ecc_uncorrected_volatile: Reading[int] = field(default_factory=_na)
    retired_pages: Reading[int] = field(default_factory=_na)
    # Row remapping (A100 and newer repair bad memory rows instead of retiring pages):
    # `nvidia-smi -q -d ROW_REMAPPER`. Rows remapped after uncorrectable errors; a remap that
    # waits for a GPU reset; a remap that failed (the board needs service).
    remapped_rows_uncorrectable: Reading[int] = field(default_factory=_na)
    row_remap_pending: Reading[bool] = field(default_factory=_na)
    row_remap_failed: Reading[bool] = field(default_factory=_na)
    # The last XID error the driver reported (DCGM_FI_DEV_XID_ERRORS; 0: none since the
    # exporter started). NVML has no such reading: `dmesg | grep -i xid` on the node.
    xid_last: Reading[int] = field(default_factory=_na)
    processes: Reading[tuple[GpuProcess, ...]] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class Gpu:
    info: GpuInfo
    state: GpuState

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        return self.info.compute_capability.get()

    @property
    def name(self) -> str:
        return str(self.info.name.get(f"GPU {self.info.index}"))


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """Driver-wide facts (``nvidia-smi --query-gpu=driver_version``)."""

    driver_version: Reading[str] = field(default_factory=_na)
    cuda_driver_version: Reading[str] = field(default_factory=_na)  # highest CUDA the driver runs
    nvml_version: Reading[str] = field(default_factory=_na)


@dataclass(frozen=True, slots=True)
class TorchInfo:
    """The installed torch and what its build can do."""

    version: Reading[str] = field(default_factory=_na)
    cuda_build: Reading[str] = field(default_factory=_na)  # torch.version.cuda; N/A on CPU builds
    cudnn_version: Reading[int] = field(default_factory=_na)
    cuda_available: Reading[bool] = field(default_factory=_na)
    device_count: Reading[int] = field(default_factory=_na)
    num_threads: Reading[int] = field(default_factory=_na)

    @property
    def build(self) -> str:
        if not self.version.ok:
            return "not installed"
        return f"CUDA {self.cuda_build.value}" if self.cuda_build.ok else "CPU"


@dataclass(frozen=True, slots=True)
class HostInfo:
    """The machine around the GPUs; on a GPU-less machine this is the report."""

    hostname: str = ""
    os: str = ""
    python: str = ""
    cpu_model: Reading[str] = field(default_factory=_na)
    cpu_flags: tuple[str, ...] = ()  # the flags that matter for ML (avx2, avx512*, amx*)
    logical_cores: Reading[int] = field(default_factory=_na)
    physical_cores: Reading[int] = field(default_factory=_na)
    numa_nodes: Reading[int] = field(default_factory=_na)
    memory_total_bytes: Reading[int] = field(default_factory=_na)
    memory_available_bytes: Reading[int] = field(default_factory=_na)
    cpu_affinity: Reading[int] = field(default_factory=_na)  # cores this process may run on
    torch: TorchInfo = field(default_factory=TorchInfo)
    cpu_max_mhz: Reading[float] = field(default_factory=_na)  # cpufreq max, else current clock
    l3_cache_bytes: Reading[int] = field(default_factory=_na)  # the largest cache level

    @property
    def has_avx512_bf16(self) -> bool:
        return "avx512_bf16" in self.cpu_flags

    @property
    def has_amx(self) -> bool:
        return any(f.startswith("amx") for f in self.cpu_flags)

    @property
    def cpu_bf16_instructions(self) -> bool:
        """This CPU has bf16 instructions (AVX512-BF16 or AMX). Not a speed: whether torch's
        bf16 matmuls beat fp32 here is measured by ``gpudiag.bench.cpu_bf16``."""
        return self.has_avx512_bf16 or self.has_amx

    @property
    def cpu_bf16_fast(self) -> bool:
        """Gone: it read the flags as a speed. The flags are ``cpu_bf16_instructions``; the
        speed is measured (``gd.bench.cpu_bf16_speed()``, an answer with its interval)."""
        raise AttributeError(
            "HostInfo.cpu_bf16_fast is gone: CPU flags say bf16 has instructions "
            "(host.cpu_bf16_instructions), not that it is faster. gd.bench.cpu_bf16_speed() "
            "measures it (once per process): .answer is 'faster', 'slower' or 'undecided', "
            "with its interval"
        )


def record_from_dict(cls: type[Any], data: dict[str, Any]) -> Any:
    """Rebuild one of the records above from its ``to_dict`` form (JSON snapshots)."""
    kwargs: dict[str, Any] = {}
    nested = {
        "pcie": PcieLink,
        "torch": TorchInfo,
        "info": GpuInfo,
        "state": GpuState,
    }
    tuples_of = {"mig_instances": MigInstance, "nvlinks": NvLink}
    for f in fields(cls):
        if f.name not in data:
            continue
        raw = data[f.name]
        if f.name in nested:
            kwargs[f.name] = record_from_dict(nested[f.name], raw)
        elif f.name in tuples_of:
            kwargs[f.name] = tuple(record_from_dict(tuples_of[f.name], r) for r in raw)
        elif f.name == "processes":
            reading = Reading.from_dict(raw)
            procs = tuple(
                GpuProcess(
                    pid=int(p["pid"]),
                    name=str(p["name"]),
                    kind=str(p["kind"]),
                    used_memory_bytes=Reading.from_dict(p["used_memory_bytes"]),
                )
                for p in (reading.value or ())
            )
            kwargs[f.name] = Reading(
                procs if reading.ok else None, reading.status, reading.reason, reading.source
            )
        elif isinstance(raw, dict) and "status" in raw:
            kwargs[f.name] = Reading.from_dict(raw)
        elif isinstance(raw, list):
            kwargs[f.name] = tuple(raw)
        else:
            kwargs[f.name] = raw
    return cls(**kwargs)
