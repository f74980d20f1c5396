"""Reads ``nvidia-smi -q -x`` output (DTD v10 to v13) into the probe's records."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag.errors import ReplayError
from gpudiag.probe.model import (
    DriverInfo,
    GpuInfo,
    GpuProcess,
    GpuState,
    MigInstance,
    PcieLink,
)
from gpudiag.probe.nvml_backend import CLOCK_EVENT_REASONS, MIG_UTILIZATION_REASON
from gpudiag.probe.readings import Reading, Status, na, ok

SOURCE = "nvidia-smi xml"
_MIB = 1 << 20
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_NA_TEXTS = {"n/a", "[n/a]", "[not supported]", "not supported", "unknown error", ""}


@dataclass(frozen=True, slots=True)
class SmiRecording:
    """One parsed ``nvidia-smi -q -x`` dump."""

    timestamp: str
    driver: DriverInfo
    infos: tuple[GpuInfo, ...]
    states: tuple[GpuState, ...]


def _number(text: str) -> float:
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"no number in {text!r}")
    return float(match.group(1))


class _Gpu:
    """Typed access to one ``<gpu>`` element; every getter returns a Reading."""

    def __init__(self, element: ET.Element) -> None:
        self.el = element

    def text(self, path: str) -> Reading[str]:
        node = self.el.find(path)
        if node is None:
            return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE)
        value = (node.text or "").strip()
        if value.lower() in _NA_TEXTS or value.lower().startswith("requested functionality"):
            return na(Status.NOT_SUPPORTED, "N/A in the recording (nvidia-smi printed N/A)", SOURCE)
        return ok(value, SOURCE)

    def first(self, *paths: str) -> Reading[str]:
        """The first of ``paths`` that has a value; else the first one's N/A reason."""
        readings = [self.text(p) for p in paths]
        for reading in readings:
            if reading.ok:
                return reading
        present = [r for r in readings if r.status is not Status.NOT_AVAILABLE]
        return (present or readings)[0]

    def convert(self, reading: Reading[str], fn: Callable[[str], Any]) -> Reading[Any]:
        if not reading.ok:
            return reading
        try:
            return ok(fn(str(reading.value)), SOURCE)
        except ValueError:
            return na(Status.UNKNOWN, f"unreadable value {reading.value!r}", SOURCE)

    def num(self, *paths: str, scale: float = 1.0, as_int: bool = False) -> Reading[Any]:
        def parse(text: str) -> float | int:
            value = _number(text) * scale
            return round(value) if as_int else value

        return self.convert(self.first(*paths), parse)

    def flag(self, path: str, true: str = "enabled") -> Reading[bool]:
        return self.convert(self.text(path), lambda t: t.strip().lower() == true)


def _pci_bus_id(gpu: _Gpu) -> Reading[str]:
    reading = gpu.text("pci/pci_bus_id")
    if not reading.ok and gpu.el.get("id"):
        reading = ok(str(gpu.el.get("id")), SOURCE)  # the <gpu id="..."> attribute is the bus id
    return gpu.convert(reading, str.upper)


def _mig_instances(gpu: _Gpu) -> tuple[MigInstance, ...]:
    out = []
    for i, node in enumerate(gpu.el.findall("mig_devices/mig_device")):
        m = _Gpu(node)
        out.append(
            MigInstance(
                index=i,
                uuid=na(Status.NOT_AVAILABLE, "nvidia-smi -q does not list MIG UUIDs", SOURCE),
                gpu_instance_id=m.num("gpu_instance_id", as_int=True),
                compute_instance_id=m.num("compute_instance_id", as_int=True),
                sm_count=m.num("device_attributes/shared/multiprocessor_count", as_int=True),
                memory_total_bytes=m.num("fb_memory_usage/total", scale=_MIB, as_int=True),
                memory_used_bytes=m.num("fb_memory_usage/used", scale=_MIB, as_int=True),
            )
        )
    return tuple(out)


def _info(gpu: _Gpu, index: int) -> GpuInfo:
    spec_missing = na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE)
    mig_enabled = gpu.flag("mig_mode/current_mig")
    return GpuInfo(
        index=index,
        name=gpu.text("product_name"),
        uuid=gpu.text("uuid"),
        pci_bus_id=_pci_bus_id(gpu),
        architecture=gpu.text("product_architecture"),
        compute_capability=spec_missing,
        sm_count=spec_missing,
        memory_total_bytes=gpu.num("fb_memory_usage/total", scale=_MIB, as_int=True),
        memory_bus_width_bits=spec_missing,
        max_sm_clock_mhz=gpu.num("max_clocks/sm_clock", as_int=True),
        max_memory_clock_mhz=gpu.num("max_clocks/mem_clock", as_int=True),
        power_limit_w=gpu.num(
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/current_power_limit",
            "power_readings/power_limit",
        ),
        default_power_limit_w=gpu.num(
            "gpu_power_readings/default_power_limit", "power_readings/default_power_limit"
        ),
        persistence_mode=gpu.flag("persistence_mode"),
        ecc_enabled=gpu.flag("ecc_mode/current_ecc"),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(gpu),
        pcie=PcieLink(
            gen_current=gpu.num("pci/pci_gpu_link_info/pcie_gen/current_link_gen", as_int=True),
            gen_max=gpu.num("pci/pci_gpu_link_info/pcie_gen/max_link_gen", as_int=True),
            width_current=gpu.num(
                "pci/pci_gpu_link_info/link_widths/current_link_width", as_int=True
            ),
            width_max=gpu.num("pci/pci_gpu_link_info/link_widths/max_link_width", as_int=True),
        ),
        nvlinks=(),  # nvidia-smi -q has no NVLink section; `nvidia-smi nvlink -s` has it
        virtualization=gpu.convert(
            gpu.text("gpu_virtualization_mode/virtualization_mode"), lambda t: t.lower()
        ),
    )


def _clock_event_reasons(gpu: _Gpu) -> Reading[tuple[str, ...]]:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        node = gpu.el.find(section)
        if node is None:
            continue
        children = list(node)
        if not children:
            return na(Status.NOT_SUPPORTED, "N/A in the recording (nvidia-smi printed N/A)", SOURCE)
        active = tuple(
            name
            for _, name in CLOCK_EVENT_REASONS
            if (child := node.find(prefix + name)) is not None
            and (child.text or "").strip().lower() == "active"
        )
        return ok(active, SOURCE)
    return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE)


def _ecc_uncorrected(gpu: _Gpu) -> Reading[int]:
    volatile = gpu.el.find("ecc_errors/volatile")
    if volatile is None:
        return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE)
    # DTD v13 splits SRAM into sram_uncorrectable_parity / _secded: every one counts, as in
    # nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE).
    paths = [c.tag for c in volatile if "_uncorrectable" in c.tag] or ["double_bit/total"]
    total = 0
    for path in paths:
        reading = gpu.num(f"ecc_errors/volatile/{path}", as_int=True)
        if not reading.ok:
            return reading
        total += int(reading.get(0))
    return ok(total, SOURCE)


def _retired_pages(gpu: _Gpu) -> Reading[int]:
    total = 0
    for cause in ("multiple_single_bit_retirement", "double_bit_retirement"):
        reading = gpu.num(f"retired_pages/{cause}/retired_count", as_int=True)
        if not reading.ok:
            return reading
        total += int(reading.get(0))
    return ok(total, SOURCE)


def _row_remapping(gpu: _Gpu) -> dict[str, Reading[Any]]:
    node = gpu.el.find("remapped_rows")
    if node is not None and not list(node):  # <remapped_rows>N/A</remapped_rows>: no remapper
        printed = na(Status.NOT_SUPPORTED, "N/A in the recording (nvidia-smi printed N/A)", SOURCE)
        return dict.fromkeys(
            ("remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed"), printed
        )
    return {
        "remapped_rows_uncorrectable": gpu.num("remapped_rows/remapped_row_unc", as_int=True),
        "row_remap_pending": gpu.flag("remapped_rows/remapped_row_pending", true="yes"),
        "row_remap_failed": gpu.flag("remapped_rows/remapped_row_failure", true="yes"),
    }


_PROCESS_KINDS = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}


def _processes(gpu: _Gpu) -> Reading[tuple[GpuProcess, ...]]:
    node = gpu.el.find("processes")
    if node is None:
        return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE)
    out = []
    for p in node.findall("process_info"):
        proc = _Gpu(p)
        pid = proc.num("pid", as_int=True)
        if not pid.ok:
            continue
        kind = proc.text("type").get("C")
        out.append(
            GpuProcess(
                pid=int(pid.get(0)),
                name=str(proc.text("process_name").get("")),
                kind=_PROCESS_KINDS.get(kind, kind.lower()),
                used_memory_bytes=proc.num("used_memory", scale=_MIB, as_int=True),
            )
        )
    return ok(tuple(out), SOURCE)


def _state(gpu: _Gpu, info: GpuInfo, timestamp: float) -> GpuState:
    if info.mig_enabled.get(False):
        mig = na(Status.NOT_AVAILABLE, MIG_UTILIZATION_REASON, SOURCE)
        gpu_util, mem_util = mig, mig
    else:
        gpu_util, mem_util = gpu.num("utilization/gpu_util"), gpu.num("utilization/memory_util")
    return GpuState(
        timestamp=timestamp,
        gpu_util_pct=gpu_util,
        memory_util_pct=mem_util,
        memory_used_bytes=gpu.num("fb_memory_usage/used", scale=_MIB, as_int=True),
        sm_clock_mhz=gpu.num("clocks/sm_clock", as_int=True),
        memory_clock_mhz=gpu.num("clocks/mem_clock", as_int=True),
        power_w=gpu.num(
            "gpu_power_readings/instant_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/instant_power_draw",
            "power_readings/power_draw",
        ),
        temperature_c=gpu.num("temperature/gpu_temp"),
        performance_state=gpu.text("performance_state"),
        clock_event_reasons=_clock_event_reasons(gpu),
        # nvidia-smi prints KB/s (1024 bytes), like NVML.
        pcie_rx_bytes_per_s=gpu.num("pci/rx_util", scale=1024.0),
        pcie_tx_bytes_per_s=gpu.num("pci/tx_util", scale=1024.0),
        nvlink_rx_bytes=na(Status.NOT_AVAILABLE, "nvidia-smi -q has no NVLink counters", SOURCE),
        nvlink_tx_bytes=na(Status.NOT_AVAILABLE, "nvidia-smi -q has no NVLink counters", SOURCE),
        ecc_uncorrected_volatile=_ecc_uncorrected(gpu),
        retired_pages=_retired_pages(gpu),
        **_row_remapping(gpu),
        processes=_processes(gpu),
    )


def parse_smi_xml(text: str | bytes, *, timestamp: float = 0.0) -> SmiRecording:
    """Parse ``nvidia-smi -q -x`` output; raises ReplayError when it is not such a file."""
    try:
        # The DOCTYPE names an external DTD that ElementTree never fetches.
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ReplayError(
            f"not valid XML ({exc}); expected the output of `nvidia-smi -q -x`"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise ReplayError(
            f"the XML root is <{root.tag}>, not <nvidia_smi_log>: "
            "expected `nvidia-smi -q -x` output"
        )
    top = _Gpu(root)
    cuda = top.text("cuda_version")
    driver = DriverInfo(
        driver_version=top.text("driver_version"),
        cuda_driver_version=cuda,
        nvml_version=na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE),
    )
    infos, states = [], []
    for index, element in enumerate(root.findall("gpu")):
        gpu = _Gpu(element)
        info = _info(gpu, index)
        infos.append(info)
        states.append(_state(gpu, info, timestamp))
    return SmiRecording(
        timestamp=str(top.text("timestamp").get("")),
        driver=driver,
        infos=tuple(infos),
        states=tuple(states),
    )


def load_smi_xml(path: str | Path) -> SmiRecording:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_smi_xml(data)
