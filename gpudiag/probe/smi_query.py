"""What ``nvidia-smi -q`` prints, field by field, in both its forms (``-q -x`` XML, ``-q`` text).

The two forms hold the same tree: the text's labels are the XML's tags as nvidia-smi titles them
("FB Memory Usage" / "Total" is ``fb_memory_usage/total``). :data:`QUERY_FIELDS` puts each
field's places in both forms side by side, and :class:`QueryReader` builds the probe's records
from either form, so a pasted ``-q`` text and a ``-q -x`` file give the same facts.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from gpudiag.probe.model import GpuInfo, GpuProcess, GpuState, MigInstance, PcieLink
from gpudiag.probe.nvml_backend import MIG_UTILIZATION_REASON
from gpudiag.probe.readings import Reading, Status, na, ok

MIB = 1 << 20
NA_TEXTS = {"n/a", "[n/a]", "[not supported]", "not supported", "unknown error", ""}
PRINTED_NA = "N/A in the recording (nvidia-smi printed N/A)"
NOT_IN_OUTPUT = "not in this nvidia-smi version's output"
PROCESS_KINDS = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")

# field -> (its paths under <gpu> in the XML, its labels under "GPU <bus id>" in the text).
# A field with several places takes the first that holds a value: names moved between drivers.
QUERY_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "name": (("product_name",), ("Product Name",)),
    "uuid": (("uuid",), ("GPU UUID",)),
    "bus_id": (("pci/pci_bus_id",), ("PCI/Bus Id",)),
    "architecture": (("product_architecture",), ("Product Architecture",)),
    "memory_total": (("fb_memory_usage/total",), ("FB Memory Usage/Total",)),
    "memory_used": (("fb_memory_usage/used",), ("FB Memory Usage/Used",)),
    "max_sm_clock": (("max_clocks/sm_clock",), ("Max Clocks/SM",)),
    "max_memory_clock": (("max_clocks/mem_clock",), ("Max Clocks/Memory",)),
    "power_limit": (
        (
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/current_power_limit",
            "power_readings/power_limit",
        ),
        (
            "GPU Power Readings/Current Power Limit",
            "Power Readings/Enforced Power Limit",
            "Power Readings/Current Power Limit",
            "Power Readings/Power Limit",
        ),
    ),
    "default_power_limit": (
        ("gpu_power_readings/default_power_limit", "power_readings/default_power_limit"),
        ("GPU Power Readings/Default Power Limit", "Power Readings/Default Power Limit"),
    ),
    "requested_power_limit": (
        ("gpu_power_readings/requested_power_limit", "power_readings/requested_power_limit"),
        ("GPU Power Readings/Requested Power Limit", "Power Readings/Requested Power Limit"),
    ),
    "persistence_mode": (("persistence_mode",), ("Persistence Mode",)),
    "ecc_mode": (("ecc_mode/current_ecc",), ("ECC Mode/Current",)),
    "mig_mode": (("mig_mode/current_mig",), ("MIG Mode/Current",)),
    "pcie_gen_current": (
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
        ("PCI/GPU Link Info/PCIe Generation/Current",),
    ),
    "pcie_gen_max": (
        ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
        ("PCI/GPU Link Info/PCIe Generation/Max",),
    ),
    "pcie_width_current": (
        ("pci/pci_gpu_link_info/link_widths/current_link_width",),
        ("PCI/GPU Link Info/Link Width/Current",),
    ),
    "pcie_width_max": (
        ("pci/pci_gpu_link_info/link_widths/max_link_width",),
        ("PCI/GPU Link Info/Link Width/Max",),
    ),
    "virtualization": (
        ("gpu_virtualization_mode/virtualization_mode",),
        ("GPU Virtualization Mode/Virtualization Mode",),
    ),
    "gpu_util": (("utilization/gpu_util",), ("Utilization/Gpu",)),
    "memory_util": (("utilization/memory_util",), ("Utilization/Memory",)),
    "sm_clock": (("clocks/sm_clock",), ("Clocks/SM",)),
    "memory_clock": (("clocks/mem_clock",), ("Clocks/Memory",)),
    "power_draw": (
        (
            "gpu_power_readings/instant_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/instant_power_draw",
            "power_readings/power_draw",
        ),
        (
            "GPU Power Readings/Instantaneous Power Draw",
            "GPU Power Readings/Power Draw",
            "Power Readings/Instantaneous Power Draw",
            "Power Readings/Power Draw",
        ),
    ),
    "temperature": (("temperature/gpu_temp",), ("Temperature/GPU Current Temp",)),
    "performance_state": (("performance_state",), ("Performance State",)),
    # nvidia-smi prints KB/s (1024 bytes), like NVML.
    "pcie_rx": (("pci/rx_util",), ("PCI/Rx Throughput",)),
    "pcie_tx": (("pci/tx_util",), ("PCI/Tx Throughput",)),
    "ecc_volatile": (("ecc_errors/volatile",), ("ECC Errors/Volatile",)),
    "ecc_double_bit_total": (("double_bit/total",), ("Double Bit/Total",)),
    "retired_single_bit": (
        ("retired_pages/multiple_single_bit_retirement/retired_count",),
        ("Retired Pages/Single Bit ECC",),
    ),
    "retired_double_bit": (
        ("retired_pages/double_bit_retirement/retired_count",),
        ("Retired Pages/Double Bit ECC",),
    ),
    "remapped_rows": (("remapped_rows",), ("Remapped Rows",)),
    "remapped_rows_uncorrectable": (
        ("remapped_rows/remapped_row_unc",),
        ("Remapped Rows/Uncorrectable Error",),
    ),
    "row_remap_pending": (("remapped_rows/remapped_row_pending",), ("Remapped Rows/Pending",)),
    "row_remap_failed": (
        ("remapped_rows/remapped_row_failure",),
        ("Remapped Rows/Remapping Failure Occurred",),
    ),
    "mig_devices": (("mig_devices/mig_device",), ("MIG Devices/MIG Device",)),
    "gpu_instance_id": (("gpu_instance_id",), ("GPU Instance ID",)),
    "compute_instance_id": (("compute_instance_id",), ("Compute Instance ID",)),
    "multiprocessor_count": (
        ("device_attributes/shared/multiprocessor_count",),
        ("Device Attributes/Shared/Multiprocessor count",),
    ),
}


def number_in(text: str) -> float:
    """The number a value starts with ("80 MiB" -> 80.0); ValueError when there is none."""
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"no number in {text!r}")
    return float(match.group(1))


class QueryReader(ABC):
    """Typed access to one GPU's part of an ``nvidia-smi -q`` dump; every getter gives a Reading.

    A subclass reads one form: it says where a path's text is (:meth:`text_at`), what is under
    a section (:meth:`children`, :meth:`child_names`) and which column of :data:`QUERY_FIELDS`
    is its own (``form``: 0 for XML, 1 for text).
    """

    source: str
    form: int

    @abstractmethod
    def text_at(self, path: str) -> Reading[str]:
        """The value printed at ``path``; N/A when it is absent or nvidia-smi printed N/A."""

    @abstractmethod
    def children(self, path: str) -> list[QueryReader]:
        """A reader for each section at ``path`` (the last part names the repeated section)."""

    @abstractmethod
    def child_names(self, path: str) -> list[str]:
        """The names of what the section at ``path`` holds, in the recording's order."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the recording has ``path`` at all (a value, a section, or N/A)."""

    @abstractmethod
    def printed_na(self, path: str) -> bool:
        """Whether the section at ``path`` is there but nvidia-smi printed N/A for all of it."""

    def paths(self, field: str) -> tuple[str, ...]:
        return QUERY_FIELDS[field][self.form]

    def na(self, status: Status, reason: str) -> Reading[Any]:
        return na(status, reason, self.source)

    def ok(self, value: Any) -> Reading[Any]:
        return ok(value, self.source)

    def first(self, *paths: str) -> Reading[str]:
        """The first of ``paths`` that has a value; else the first one's N/A reason."""
        readings = [self.text_at(p) for p in paths]
        for reading in readings:
            if reading.ok:
                return reading
        present = [r for r in readings if r.status is not Status.NOT_AVAILABLE]
        return (present or readings)[0]

    def convert(self, reading: Reading[str], fn: Callable[[str], Any]) -> Reading[Any]:
        if not reading.ok:
            return reading
        try:
            return self.ok(fn(str(reading.value)))
        except ValueError:
            return self.na(Status.UNKNOWN, f"unreadable value {reading.value!r}")

    def number_at(self, *paths: str, scale: float = 1.0, as_int: bool = False) -> Reading[Any]:
        def parse(text: str) -> float | int:
            value = number_in(text) * scale
            return round(value) if as_int else value

        return self.convert(self.first(*paths), parse)

    def text(self, field: str) -> Reading[str]:
        return self.first(*self.paths(field))

    def number(self, field: str, *, scale: float = 1.0, as_int: bool = False) -> Reading[Any]:
        return self.number_at(*self.paths(field), scale=scale, as_int=as_int)

    def flag(self, field: str, true: str = "enabled") -> Reading[bool]:
        return self.convert(self.text(field), lambda t: t.strip().lower() == true)

    # --- the records -------------------------------------------------------------------------

    def mig_instances(self) -> tuple[MigInstance, ...]:
        no_uuid = self.na(Status.NOT_AVAILABLE, "nvidia-smi -q does not list MIG UUIDs")
        return tuple(
            MigInstance(
                index=i,
                uuid=no_uuid,
                gpu_instance_id=m.number("gpu_instance_id", as_int=True),
                compute_instance_id=m.number("compute_instance_id", as_int=True),
                sm_count=m.number("multiprocessor_count", as_int=True),
                memory_total_bytes=m.number("memory_total", scale=MIB, as_int=True),
                memory_used_bytes=m.number("memory_used", scale=MIB, as_int=True),
            )
            for i, m in enumerate(self.children(self.paths("mig_devices")[0]))
        )

    def info(self, index: int, *, pci_bus_id: Reading[str]) -> GpuInfo:
        """Static facts. ``pci_bus_id``: the form's own fallback when ``bus_id`` is absent."""
        missing = self.na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q")
        bus = self.text("bus_id")
        return GpuInfo(
            index=index,
            name=self.text("name"),
            uuid=self.text("uuid"),
            pci_bus_id=self.convert(bus if bus.ok or not pci_bus_id.ok else pci_bus_id, str.upper),
            architecture=self.text("architecture"),
            compute_capability=missing,
            sm_count=missing,
            memory_total_bytes=self.number("memory_total", scale=MIB, as_int=True),
            memory_bus_width_bits=missing,
            max_sm_clock_mhz=self.number("max_sm_clock", as_int=True),
            max_memory_clock_mhz=self.number("max_memory_clock", as_int=True),
            power_limit_w=self.number("power_limit"),
            default_power_limit_w=self.number("default_power_limit"),
            requested_power_limit_w=self.number("requested_power_limit"),
            persistence_mode=self.flag("persistence_mode"),
            ecc_enabled=self.flag("ecc_mode"),
            mig_enabled=self.flag("mig_mode"),
            mig_instances=self.mig_instances(),
            pcie=PcieLink(
                gen_current=self.number("pcie_gen_current", as_int=True),
                gen_max=self.number("pcie_gen_max", as_int=True),
                width_current=self.number("pcie_width_current", as_int=True),
                width_max=self.number("pcie_width_max", as_int=True),
            ),
            nvlinks=(),  # nvidia-smi -q has no NVLink section; `nvidia-smi nvlink -s` has it
            virtualization=self.convert(self.text("virtualization"), str.lower),
        )

    def ecc_uncorrected(self) -> Reading[int]:
        """Volatile uncorrectable errors: every SRAM (parity, SEC-DED) and DRAM count on Hopper
        (DTD v13), as ``nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)``; else the older
        double-bit total."""
        (volatile,) = self.paths("ecc_volatile")
        if not self.exists(volatile):
            return self.na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT)
        names = [n for n in self.child_names(volatile) if "uncorrectable" in n.lower()]
        total = 0
        for name in names or self.paths("ecc_double_bit_total"):
            reading = self.number_at(f"{volatile}/{name}", as_int=True)
            if not reading.ok:
                return reading
            total += int(reading.get(0))
        return self.ok(total)

    def retired_pages(self) -> Reading[int]:
        total = 0
        for cause in ("retired_single_bit", "retired_double_bit"):
            reading = self.number(cause, as_int=True)
            if not reading.ok:
                (remap,) = self.paths("remapped_rows")
                if self.exists(remap) and not self.printed_na(remap):
                    return self.na(
                        Status.NOT_SUPPORTED,
                        "this GPU remaps rows instead of retiring pages (Ampere and later: "
                        "see `nvidia-smi -q -d ROW_REMAPPER`)",
                    )
                return reading
            total += int(reading.get(0))
        return self.ok(total)

    def row_remapping(self) -> dict[str, Reading[Any]]:
        if self.printed_na(self.paths("remapped_rows")[0]):  # no row remapper on this GPU
            printed = self.na(Status.NOT_SUPPORTED, PRINTED_NA)
            return dict.fromkeys(
                ("remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed"), printed
            )
        return {
            "remapped_rows_uncorrectable": self.number("remapped_rows_uncorrectable", as_int=True),
            "row_remap_pending": self.flag("row_remap_pending", true="yes"),
            "row_remap_failed": self.flag("row_remap_failed", true="yes"),
        }

    @abstractmethod
    def clock_event_reasons(self) -> Reading[tuple[str, ...]]:
        """The active clock event reasons, as NVML names them."""

    @abstractmethod
    def processes(self) -> Reading[tuple[GpuProcess, ...]]:
        """The processes using this GPU."""

    def state(self, info: GpuInfo, timestamp: float) -> GpuState:
        if info.mig_enabled.get(False):
            mig = self.na(Status.NOT_AVAILABLE, MIG_UTILIZATION_REASON)
            gpu_util, mem_util = mig, mig
        else:
            gpu_util, mem_util = self.number("gpu_util"), self.number("memory_util")
        no_nvlink = self.na(Status.NOT_AVAILABLE, "nvidia-smi -q has no NVLink counters")
        return GpuState(
            timestamp=timestamp,
            gpu_util_pct=gpu_util,
            memory_util_pct=mem_util,
            memory_used_bytes=self.number("memory_used", scale=MIB, as_int=True),
            sm_clock_mhz=self.number("sm_clock", as_int=True),
            memory_clock_mhz=self.number("memory_clock", as_int=True),
            power_w=self.number("power_draw"),
            temperature_c=self.number("temperature"),
            performance_state=self.text("performance_state"),
            clock_event_reasons=self.clock_event_reasons(),
            pcie_rx_bytes_per_s=self.number("pcie_rx", scale=1024.0),
            pcie_tx_bytes_per_s=self.number("pcie_tx", scale=1024.0),
            nvlink_rx_bytes=no_nvlink,
            nvlink_tx_bytes=no_nvlink,
            ecc_uncorrected_volatile=self.ecc_uncorrected(),
            retired_pages=self.retired_pages(),
            **self.row_remapping(),
            processes=self.processes(),
        )


def process(pid: int, name: str, kind: str, used_memory: Reading[Any]) -> GpuProcess:
    """One row of a process list; ``kind`` as nvidia-smi prints it (C, G, C+G)."""
    return GpuProcess(
        pid=pid,
        name=name,
        kind=PROCESS_KINDS.get(kind, kind.lower()),
        used_memory_bytes=used_memory,
    )
