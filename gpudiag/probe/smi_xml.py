"""Reads ``nvidia-smi -q -x`` output (DTD v10 to v13) into the probe's records."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from gpudiag._files import RECORDING_BYTES, read_bytes
from gpudiag.errors import ReplayError
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuProcess, GpuState
from gpudiag.probe.nvml_backend import CLOCK_EVENT_REASONS
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.probe.smi_query import MIB, NA_TEXTS, NOT_IN_OUTPUT, PRINTED_NA, QueryReader, process

SOURCE = "nvidia-smi xml"


@dataclass(frozen=True, slots=True)
class SmiRecording:
    """One parsed ``nvidia-smi -q -x`` dump."""

    timestamp: str
    driver: DriverInfo
    infos: tuple[GpuInfo, ...]
    states: tuple[GpuState, ...]


class _Gpu(QueryReader):
    """One ``<gpu>`` element (or a section inside one) of the XML."""

    source = SOURCE
    form = 0

    def __init__(self, element: ET.Element) -> None:
        self.el = element

    def text_at(self, path: str) -> Reading[str]:
        node = self.el.find(path)
        if node is None:
            return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE)
        value = (node.text or "").strip()
        if value.lower() in NA_TEXTS or value.lower().startswith("requested functionality"):
            return na(Status.NOT_SUPPORTED, PRINTED_NA, SOURCE)
        return ok(value, SOURCE)

    def children(self, path: str) -> list[QueryReader]:
        return [_Gpu(node) for node in self.el.findall(path)]

    def child_names(self, path: str) -> list[str]:
        node = self.el.find(path)
        return [] if node is None else [child.tag for child in node]

    def exists(self, path: str) -> bool:
        return self.el.find(path) is not None

    def printed_na(self, path: str) -> bool:
        node = self.el.find(path)  # <remapped_rows>N/A</remapped_rows>: a section left empty
        return node is not None and not list(node)

    def clock_event_reasons(self) -> Reading[tuple[str, ...]]:
        for section, prefix in (
            ("clocks_event_reasons", "clocks_event_reason_"),
            ("clocks_throttle_reasons", "clocks_throttle_reason_"),
        ):
            node = self.el.find(section)
            if node is None:
                continue
            if not list(node):
                return na(Status.NOT_SUPPORTED, PRINTED_NA, SOURCE)
            active = tuple(
                name
                for _, name in CLOCK_EVENT_REASONS
                if (child := node.find(prefix + name)) is not None
                and (child.text or "").strip().lower() == "active"
            )
            return ok(active, SOURCE)
        return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE)

    def processes(self) -> Reading[tuple[GpuProcess, ...]]:
        node = self.el.find("processes")
        if node is None:
            return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE)
        out = []
        for p in node.findall("process_info"):
            proc = _Gpu(p)
            pid = proc.number_at("pid", as_int=True)
            if pid.ok:
                out.append(
                    process(
                        int(pid.get(0)),
                        str(proc.text_at("process_name").get("")),
                        str(proc.text_at("type").get("C")),
                        proc.number_at("used_memory", scale=MIB, as_int=True),
                    )
                )
        return ok(tuple(out), SOURCE)


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
    cuda = top.text_at("cuda_version")
    driver = DriverInfo(
        driver_version=top.text_at("driver_version"),
        cuda_driver_version=cuda,
        nvml_version=na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE),
    )
    infos, states = [], []
    for index, element in enumerate(root.findall("gpu")):
        gpu = _Gpu(element)
        # The <gpu id="..."> attribute is the bus id.
        bus_id = element.get("id")
        fallback = ok(bus_id, SOURCE) if bus_id else na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE)
        info = gpu.info(index, pci_bus_id=fallback)
        infos.append(info)
        states.append(gpu.state(info, timestamp))
    return SmiRecording(
        timestamp=str(top.text_at("timestamp").get("")),
        driver=driver,
        infos=tuple(infos),
        states=tuple(states),
    )


def load_smi_xml(path: str | Path) -> SmiRecording:
    data = read_bytes(path, "nvidia-smi recording", max_bytes=RECORDING_BYTES, error=ReplayError)
    return parse_smi_xml(data)
