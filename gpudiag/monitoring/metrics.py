"""What the monitor records: metric definitions, devices, and series (device x metric) keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import FieldsDict


@dataclass(frozen=True, slots=True)
class MetricSpec(FieldsDict):
    """One metric: its key (units in the name), label, unit, and what it means.

    ``check`` is the command that shows the same number by hand, so a user can verify us.
    ``scale`` is the 0..max range a chart should use (None: from the data).
    """

    key: str
    label: str
    unit: str
    description: str
    check: str = ""
    # "gpu", "activity" (hardware counters), "derived", "host", "errors" (DCGM error counts)
    kind: str = "gpu"
    scale_max: float | None = None


def _m(*args: Any, **kwargs: Any) -> MetricSpec:
    return MetricSpec(*args, **kwargs)


METRICS: dict[str, MetricSpec] = {
    m.key: m
    for m in (
        _m(
            "gpu_util_pct",
            "GPU utilization",
            "%",
            "Share of time at least one kernel ran: 100 % can still leave most SMs idle",
            "nvidia-smi --query-gpu=utilization.gpu --format=csv -lms 100",
            scale_max=100.0,
        ),
        _m(
            "memory_util_pct",
            "Memory-controller utilization",
            "%",
            "Share of time device memory was read or written (busy time, not bandwidth)",
            "nvidia-smi --query-gpu=utilization.memory --format=csv -lms 100",
            scale_max=100.0,
        ),
        _m(
            "memory_used_bytes",
            "Memory used",
            "B",
            "Device memory in use by all processes (what nvidia-smi shows, not torch's cache)",
            "nvidia-smi --query-gpu=memory.used --format=csv",
        ),
        _m(
            "memory_used_pct",
            "Memory used",
            "%",
            "Memory used against the total",
            "nvidia-smi --query-gpu=memory.used,memory.total --format=csv",
            kind="derived",
            scale_max=100.0,
        ),
        _m(
            "sm_clock_mhz",
            "SM clock",
            "MHz",
            "Current SM clock; a drop under load with a clock-event reason is throttling",
            "nvidia-smi --query-gpu=clocks.sm --format=csv",
        ),
        _m(
            "memory_clock_mhz",
            "Memory clock",
            "MHz",
            "Current memory clock",
            "nvidia-smi --query-gpu=clocks.mem --format=csv",
        ),
        _m(
            "power_w",
            "Power",
            "W",
            "Board power draw",
            "nvidia-smi --query-gpu=power.draw --format=csv",
        ),
        _m(
            "power_pct_of_limit",
            "Power vs limit",
            "%",
            "Power draw against the enforced power limit; near 100 % the clocks get capped",
            "nvidia-smi --query-gpu=power.draw,enforced.power.limit --format=csv",
            kind="derived",
            scale_max=100.0,
        ),
        _m(
            "temperature_c",
            "Temperature",
            "°C",
            "GPU core temperature",
            "nvidia-smi --query-gpu=temperature.gpu --format=csv",
        ),
        _m(
            "pcie_rx_bytes_per_s",
            "PCIe RX",
            "B/s",
            "Host-to-GPU PCIe traffic",
            "nvidia-smi dmon -s t",
        ),
        _m(
            "pcie_tx_bytes_per_s",
            "PCIe TX",
            "B/s",
            "GPU-to-host PCIe traffic",
            "nvidia-smi dmon -s t",
        ),
        _m(
            "nvlink_rx_bytes_per_s",
            "NVLink RX",
            "B/s",
            "NVLink data received, all links (rate from NVML's cumulative counters or DCGM)",
            "nvidia-smi nvlink -gt d",
        ),
        _m(
            "nvlink_tx_bytes_per_s",
            "NVLink TX",
            "B/s",
            "NVLink data sent, all links",
            "nvidia-smi nvlink -gt d",
        ),
        _m(
            "gr_engine_active_pct",
            "Graphics engine active",
            "%",
            "Share of time the graphics/compute engine was busy (DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
            "dcgmi dmon -e 1001",
            kind="activity",
            scale_max=100.0,
        ),
        _m(
            "sm_active_pct",
            "SM active",
            "%",
            "Share of time an SM had at least one warp, averaged over SMs "
            "(DCGM_FI_PROF_SM_ACTIVE; GPM SM_UTIL): low with high GPU utilization means "
            "small kernels or too few blocks",
            "dcgmi dmon -e 1002",
            kind="activity",
            scale_max=100.0,
        ),
        _m(
            "sm_occupancy_pct",
            "SM occupancy",
            "%",
            "Resident warps against the maximum an SM can hold (DCGM_FI_PROF_SM_OCCUPANCY)",
            "dcgmi dmon -e 1003",
            kind="activity",
            scale_max=100.0,
        ),
        _m(
            "tensor_active_pct",
            "Tensor pipe active",
            "%",
            "Share of cycles the tensor cores were busy (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE; "
            "GPM ANY_TENSOR_UTIL): near 0 in training means no fp16/bf16/tf32 matmuls",
            "dcgmi dmon -e 1004",
            kind="activity",
            scale_max=100.0,
        ),
        _m(
            "dram_active_pct",
            "DRAM active",
            "%",
            "Share of cycles device memory moved data: achieved bandwidth against peak "
            "(DCGM_FI_PROF_DRAM_ACTIVE; GPM DRAM_BW_UTIL)",
            "dcgmi dmon -e 1005",
            kind="activity",
            scale_max=100.0,
        ),
        _m(
            "memory_bandwidth_gbps",
            "Memory bandwidth (est.)",
            "GB/s",
            "Achieved memory bandwidth estimate: DRAM active x peak bandwidth; without "
            "activity counters, memory-controller utilization x peak, a rough upper bound",
            "dcgmi dmon -e 1005",
            kind="derived",
        ),
        _m(
            "memory_bandwidth_pct_of_peak",
            "Memory bandwidth vs peak",
            "%",
            "The estimate above against the card's peak memory bandwidth",
            "dcgmi dmon -e 1005",
            kind="derived",
            scale_max=100.0,
        ),
        _m(
            "throttled",
            "Clocks throttled",
            "",
            "1 while a clock-event reason other than idle or an application setting holds "
            "the clocks down (power cap, thermal, HW slowdown, sync boost)",
            "nvidia-smi -q -d PERFORMANCE",
            kind="derived",
            scale_max=1.0,
        ),
        _m(
            "xid_last",
            "Last XID error",
            "",
            "The code of the last XID error the driver logged (DCGM_FI_DEV_XID_ERRORS; 0: none "
            "since the exporter started). 48, 63, 64, 74, 79, 92, 94, 95 are memory, NVLink or "
            "fallen-off-the-bus faults",
            "dmesg | grep -i xid",
            kind="errors",
        ),
        _m(
            "ecc_uncorrected_volatile",
            "Uncorrected ECC errors",
            "",
            "Double-bit ECC errors since the last driver load (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL); "
            "any is a fault that kills the job touching that memory",
            "nvidia-smi -q -d ECC",
            kind="errors",
        ),
        _m(
            "remapped_rows_uncorrectable",
            "Rows remapped (uncorrectable)",
            "",
            "Memory rows remapped after uncorrectable errors "
            "(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS); a rising count needs a GPU reset",
            "nvidia-smi -q -d ROW_REMAPPER",
            kind="errors",
        ),
        _m(
            "cpu_util_pct",
            "CPU utilization",
            "%",
            "All cores, share of time busy since the previous sample",
            "top",
            kind="host",
            scale_max=100.0,
        ),
        _m(
            "cpu_core_util_pct",
            "CPU per core",
            "%",
            "Each core's share of time busy; one line per core",
            "mpstat -P ALL 1",
            kind="host",
            scale_max=100.0,
        ),
        _m(
            "process_rss_bytes",
            "Kernel process RSS",
            "B",
            "Resident memory of this Python process (the notebook kernel)",
            "ps -o rss -p PID",
            kind="host",
        ),
        _m(
            "process_threads",
            "Kernel process threads",
            "",
            "Threads of this Python process (DataLoader workers are separate processes)",
            "ps -o nlwp -p PID",
            kind="host",
        ),
        _m(
            "process_cpu_pct",
            "Kernel process CPU",
            "%",
            "CPU time of this Python process; 100 % per busy core",
            "top -p PID",
            kind="host",
        ),
    )
}

# What the widget shows first: the questions users ask first.
DEFAULT_GPU_METRICS: tuple[str, ...] = (
    "gpu_util_pct",
    "sm_active_pct",
    "tensor_active_pct",
    "memory_bandwidth_pct_of_peak",
    "memory_used_bytes",
    "power_w",
    "sm_clock_mhz",
    "temperature_c",
)
DEFAULT_HOST_METRICS: tuple[str, ...] = (
    "cpu_util_pct",
    "cpu_core_util_pct",
    "memory_used_pct",
    "process_rss_bytes",
    "process_threads",
    "process_cpu_pct",
)


# Metrics that are 0 or 1 (a state, not an amount): shown as no/yes.
FLAG_METRICS: frozenset[str] = frozenset({"throttled"})


def metric_label(key: str, unit: str = "", lane: str = "") -> str:
    """A person's name for a series: ``cpu_util_pct`` -> "CPU utilization (%)"."""
    spec = metric_spec(key, unit)
    shown_unit = unit or spec.unit
    if key in FLAG_METRICS or shown_unit in {"B", "B/s"}:
        shown_unit = ""  # a flag has none; byte values carry their own scaled unit
    text = spec.label + (f" ({shown_unit})" if shown_unit else "")
    return f"{text} [{lane}]" if lane else text


def metric_spec(key: str, unit: str = "", label: str | None = None) -> MetricSpec:
    """The spec of ``key``; an unknown key (from a newer recording) gets a plain one."""
    spec = METRICS.get(key)
    if spec is not None:
        return spec
    return MetricSpec(key, label or key.replace("_", " "), unit, "recorded metric", kind="gpu")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device the monitor watches: a GPU, or the host in GPU-less mode.

    ``facts`` holds what derived metrics need (peak bandwidth with its source, power
    limit, memory total); a fact is missing when it was not known.
    """

    id: str
    label: str
    kind: str = "gpu"
    name: str = ""
    uuid: str = ""
    host: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from gpudiag._report import jsonable

        return {
            "id": self.id,
            "label": self.label,
            "kind": self.kind,
            "name": self.name,
            "uuid": self.uuid,
            "host": self.host,
            "facts": jsonable(self.facts),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceSpec:
        return cls(
            id=str(data["id"]),
            label=str(data.get("label", data["id"])),
            kind=str(data.get("kind", "gpu")),
            name=str(data.get("name", "")),
            uuid=str(data.get("uuid", "")),
            host=str(data.get("host", "")),
            facts=dict(data.get("facts") or {}),
        )


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """One recorded column: a metric of a device; ``lane`` splits one metric (CPU cores)."""

    device: str
    metric: str
    lane: str = ""

    @property
    def name(self) -> str:
        return f"{self.metric}[{self.lane}]" if self.lane else self.metric

    def to_list(self) -> list[str]:
        return [self.device, self.metric, self.lane] if self.lane else [self.device, self.metric]

    @classmethod
    def from_list(cls, data: list[str] | tuple[str, ...]) -> SeriesKey:
        return cls(str(data[0]), str(data[1]), str(data[2]) if len(data) > 2 else "")


__all__ = [
    "DEFAULT_GPU_METRICS",
    "DEFAULT_HOST_METRICS",
    "METRICS",
    "DeviceSpec",
    "MetricSpec",
    "SeriesKey",
    "metric_spec",
]
