"""Reads the text ``nvidia-smi`` prints (``nvidia-smi -q`` and the plain table) into probe records.

What a user pastes from a cluster is usually text, not ``-q -x`` XML. Both text forms give the
same records as :mod:`gpudiag.probe.smi_xml`, so a replay of either runs the same code paths:

- ``nvidia-smi -q``: an indented "Label : value" tree per GPU, labels as in the XML's tags
  ("FB Memory Usage" / "Total" is ``fb_memory_usage/total``). Checked on real dumps of 8x H100
  SXM, 2x H100 NVL, H200 and GH200 (drivers 550-565). The "MIG Devices" and process sections
  follow the XML's layout: no recorded text dump of a MIG GPU or of a busy GPU's process list
  exists in the fixtures, so those two parts are untested on real text.
- ``nvidia-smi`` (the table): name, bus id, persistence, temperature, P-state, power draw and
  cap, memory used/total, utilization, compute and MIG mode, uncorrected ECC, processes. Every
  other field is N/A with a reason that says to record ``nvidia-smi -q`` instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from gpudiag.probe.nvml_backend import MIG_UTILIZATION_REASON
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.probe.smi_xml import SmiRecording

SOURCE_QUERY = "nvidia-smi -q text"
SOURCE_TABLE = "nvidia-smi table"
_MIB = 1 << 20
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_NA_TEXTS = {"n/a", "[n/a]", "[not supported]", "not supported", "unknown error", ""}
_QUERY_BANNER = "NVSMI LOG"
_TABLE_BANNER = re.compile(r"^\|\s*NVIDIA-SMI\s+\S+", re.MULTILINE)
_PRINTED_NA = "N/A in the recording (nvidia-smi printed N/A)"
TABLE_HOLDS = (
    "plain `nvidia-smi` table: name, bus id, memory, power, temperature, utilization and "
    "processes only; `nvidia-smi -q` has clocks, PCIe, ECC and UUIDs"
)
_TABLE_ONLY = "not shown by the plain `nvidia-smi` table; record `nvidia-smi -q` for it"

# "Clocks Event Reasons" (driver 535+) / "Clocks Throttle Reasons" labels -> NVML reason names.
_CLOCK_EVENT_LABELS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "display clock setting": "display_clocks_setting",
}
_PROCESS_KINDS = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}


def looks_like_smi_text(data: bytes | str) -> str | None:
    """Which nvidia-smi text this is: "query" (``nvidia-smi -q``), "table" (plain), or None."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    head = text[:4096]
    if _QUERY_BANNER in head and "Attached GPUs" in text:
        return "query"
    if _TABLE_BANNER.search(head):
        return "table"
    return None


# --- nvidia-smi -q --------------------------------------------------------------------------


@dataclass
class _Node:
    """One "Label : value" line and the lines indented under it."""

    label: str
    value: str | None = None
    children: list[_Node] = field(default_factory=list)

    def find(self, path: str) -> _Node | None:
        node: _Node | None = self
        for part in path.split("/"):
            if node is None:
                return None
            key = part.lower()
            node = next((c for c in node.children if c.label.lower() == key), None)
        return node

    def find_all(self, label: str) -> list[_Node]:
        return [c for c in self.children if c.label.lower() == label.lower()]

    def walk(self) -> Iterator[_Node]:
        for child in self.children:
            yield child
            yield from child.walk()


def _tree(text: str) -> _Node:
    root = _Node("")
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        label, sep, value = line.strip().partition(" : ")
        if not sep and line.rstrip().endswith(" :"):
            label, value, sep = line.strip()[:-1], "", ":"
        node = _Node(label.strip(), value.strip() if sep else None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


class _Section:
    """Typed access to one GPU's subtree; every getter returns a Reading."""

    def __init__(self, node: _Node) -> None:
        self.node = node

    def text(self, path: str) -> Reading[str]:
        found = self.node.find(path)
        if found is None or found.value is None:
            return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE_QUERY)
        value = found.value
        if value.lower() in _NA_TEXTS or value.lower().startswith("requested functionality"):
            return na(Status.NOT_SUPPORTED, _PRINTED_NA, SOURCE_QUERY)
        return ok(value, SOURCE_QUERY)

    def first(self, *paths: str) -> Reading[str]:
        readings = [self.text(p) for p in paths]
        for reading in readings:
            if reading.ok:
                return reading
        present = [r for r in readings if r.status is not Status.NOT_AVAILABLE]
        return (present or readings)[0]

    def num(self, *paths: str, scale: float = 1.0, as_int: bool = False) -> Reading[Any]:
        return _convert(self.first(*paths), scale=scale, as_int=as_int, source=SOURCE_QUERY)

    def flag(self, path: str, true: str = "enabled") -> Reading[bool]:
        reading = self.text(path)
        if not reading.ok:
            return na(reading.status, reading.reason, SOURCE_QUERY)
        return ok(str(reading.value).lower() == true, SOURCE_QUERY)


def _convert(reading: Reading[str], *, scale: float, as_int: bool, source: str) -> Reading[Any]:
    if not reading.ok:
        return reading
    match = _NUMBER.match(str(reading.value))
    if match is None:
        return na(Status.UNKNOWN, f"unreadable value {reading.value!r}", source)
    value = float(match.group(1)) * scale
    return ok(round(value) if as_int else value, source)


def _mig_instances(gpu: _Section) -> tuple[MigInstance, ...]:
    section = gpu.node.find("MIG Devices")
    if section is None:
        return ()
    out = []
    for i, node in enumerate(section.find_all("MIG Device")):
        m = _Section(node)
        out.append(
            MigInstance(
                index=i,
                uuid=na(
                    Status.NOT_AVAILABLE, "nvidia-smi -q does not list MIG UUIDs", SOURCE_QUERY
                ),
                gpu_instance_id=m.num("GPU Instance ID", as_int=True),
                compute_instance_id=m.num("Compute Instance ID", as_int=True),
                sm_count=m.num("Device Attributes/Shared/Multiprocessor count", as_int=True),
                memory_total_bytes=m.num("FB Memory Usage/Total", scale=_MIB, as_int=True),
                memory_used_bytes=m.num("FB Memory Usage/Used", scale=_MIB, as_int=True),
            )
        )
    return tuple(out)


def _query_info(gpu: _Section, bus_id: str, index: int) -> GpuInfo:
    missing = na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE_QUERY)
    link = "PCI/GPU Link Info"
    pci = gpu.text("PCI/Bus Id")
    if not pci.ok and bus_id:
        pci = ok(bus_id, SOURCE_QUERY)  # the "GPU 00000000:18:00.0" header is the bus id
    virtualization = gpu.text("GPU Virtualization Mode/Virtualization Mode")
    return GpuInfo(
        index=index,
        name=gpu.text("Product Name"),
        uuid=gpu.text("GPU UUID"),
        pci_bus_id=ok(str(pci.value).upper(), SOURCE_QUERY) if pci.ok else pci,
        architecture=gpu.text("Product Architecture"),
        compute_capability=missing,
        sm_count=missing,
        memory_total_bytes=gpu.num("FB Memory Usage/Total", scale=_MIB, as_int=True),
        memory_bus_width_bits=missing,
        max_sm_clock_mhz=gpu.num("Max Clocks/SM", as_int=True),
        max_memory_clock_mhz=gpu.num("Max Clocks/Memory", as_int=True),
        power_limit_w=gpu.num(
            "GPU Power Readings/Current Power Limit",
            "Power Readings/Enforced Power Limit",
            "Power Readings/Current Power Limit",
            "Power Readings/Power Limit",
        ),
        default_power_limit_w=gpu.num(
            "GPU Power Readings/Default Power Limit", "Power Readings/Default Power Limit"
        ),
        persistence_mode=gpu.flag("Persistence Mode"),
        ecc_enabled=gpu.flag("ECC Mode/Current"),
        mig_enabled=gpu.flag("MIG Mode/Current"),
        mig_instances=_mig_instances(gpu),
        pcie=PcieLink(
            gen_current=gpu.num(f"{link}/PCIe Generation/Current", as_int=True),
            gen_max=gpu.num(f"{link}/PCIe Generation/Max", as_int=True),
            width_current=gpu.num(f"{link}/Link Width/Current", as_int=True),
            width_max=gpu.num(f"{link}/Link Width/Max", as_int=True),
        ),
        nvlinks=(),  # nvidia-smi -q has no NVLink section; `nvidia-smi nvlink -s` has it
        virtualization=ok(str(virtualization.value).lower(), SOURCE_QUERY)
        if virtualization.ok
        else virtualization,
    )


def _clock_event_reasons(gpu: _Section) -> Reading[tuple[str, ...]]:
    for label in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
        section = gpu.node.find(label)
        if section is None:
            continue
        if section.value is not None and section.value.lower() in _NA_TEXTS:
            return na(Status.NOT_SUPPORTED, _PRINTED_NA, SOURCE_QUERY)
        seen = {
            _CLOCK_EVENT_LABELS[n.label.lower()]: (n.value or "").lower() == "active"
            for n in section.walk()
            if n.label.lower() in _CLOCK_EVENT_LABELS
        }
        if not seen:
            return na(Status.NOT_SUPPORTED, "no clock event reasons in the recording", SOURCE_QUERY)
        order = list(_CLOCK_EVENT_LABELS.values())
        return ok(tuple(sorted((k for k, v in seen.items() if v), key=order.index)), SOURCE_QUERY)
    return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE_QUERY)


def _ecc_uncorrected(gpu: _Section) -> Reading[int]:
    """Volatile uncorrectable errors: SRAM (parity, SEC-DED) and DRAM on Hopper, or the
    older "Double Bit / Total"."""
    volatile = gpu.node.find("ECC Errors/Volatile")
    if volatile is None:
        return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE_QUERY)
    section = _Section(volatile)
    paths = [c.label for c in volatile.children if "uncorrectable" in c.label.lower()]
    total = 0
    for path in paths or ["Double Bit/Total"]:
        reading = section.num(path, as_int=True)
        if not reading.ok:
            return reading
        total += int(reading.get(0))
    return ok(total, SOURCE_QUERY)


def _retired_pages(gpu: _Section) -> Reading[int]:
    total = 0
    for cause in ("Single Bit ECC", "Double Bit ECC"):
        reading = gpu.num(f"Retired Pages/{cause}", as_int=True)
        if not reading.ok:
            if gpu.node.find("Remapped Rows") is not None:
                return na(
                    Status.NOT_SUPPORTED,
                    "this GPU remaps rows instead of retiring pages (A100/Hopper: see "
                    "`nvidia-smi -q -d ROW_REMAPPER`)",
                    SOURCE_QUERY,
                )
            return reading
        total += int(reading.get(0))
    return ok(total, SOURCE_QUERY)


def _query_processes(gpu: _Section) -> Reading[tuple[GpuProcess, ...]]:
    node = gpu.node.find("Processes")
    if node is None:
        return na(Status.NOT_AVAILABLE, "not in this nvidia-smi version's output", SOURCE_QUERY)
    out = []
    for p in node.find_all("Process ID"):
        if p.value is None or not p.value.strip().isdigit():
            continue
        proc = _Section(p)
        kind = str(proc.text("Type").get("C"))
        out.append(
            GpuProcess(
                pid=int(p.value),
                name=str(proc.text("Name").get("")),
                kind=_PROCESS_KINDS.get(kind, kind.lower()),
                used_memory_bytes=proc.num("Used GPU Memory", scale=_MIB, as_int=True),
            )
        )
    return ok(tuple(out), SOURCE_QUERY)


def _query_state(gpu: _Section, info: GpuInfo, timestamp: float) -> GpuState:
    if info.mig_enabled.get(False):
        mig = na(Status.NOT_AVAILABLE, MIG_UTILIZATION_REASON, SOURCE_QUERY)
        gpu_util, mem_util = mig, mig
    else:
        gpu_util, mem_util = gpu.num("Utilization/Gpu"), gpu.num("Utilization/Memory")
    no_nvlink = na(Status.NOT_AVAILABLE, "nvidia-smi -q has no NVLink counters", SOURCE_QUERY)
    return GpuState(
        timestamp=timestamp,
        gpu_util_pct=gpu_util,
        memory_util_pct=mem_util,
        memory_used_bytes=gpu.num("FB Memory Usage/Used", scale=_MIB, as_int=True),
        sm_clock_mhz=gpu.num("Clocks/SM", as_int=True),
        memory_clock_mhz=gpu.num("Clocks/Memory", as_int=True),
        power_w=gpu.num(
            "GPU Power Readings/Instantaneous Power Draw",
            "GPU Power Readings/Power Draw",
            "Power Readings/Instantaneous Power Draw",
            "Power Readings/Power Draw",
        ),
        temperature_c=gpu.num("Temperature/GPU Current Temp"),
        performance_state=gpu.text("Performance State"),
        clock_event_reasons=_clock_event_reasons(gpu),
        # nvidia-smi prints KB/s (1024 bytes), like NVML.
        pcie_rx_bytes_per_s=gpu.num("PCI/Rx Throughput", scale=1024.0),
        pcie_tx_bytes_per_s=gpu.num("PCI/Tx Throughput", scale=1024.0),
        nvlink_rx_bytes=no_nvlink,
        nvlink_tx_bytes=no_nvlink,
        ecc_uncorrected_volatile=_ecc_uncorrected(gpu),
        retired_pages=_retired_pages(gpu),
        remapped_rows_uncorrectable=gpu.num("Remapped Rows/Uncorrectable Error", as_int=True),
        row_remap_pending=gpu.flag("Remapped Rows/Pending", true="yes"),
        row_remap_failed=gpu.flag("Remapped Rows/Remapping Failure Occurred", true="yes"),
        processes=_query_processes(gpu),
    )


def parse_smi_query_text(text: str, *, timestamp: float = 0.0) -> SmiRecording:
    """Parse ``nvidia-smi -q`` output; raises ReplayError when it is not such a text."""
    if looks_like_smi_text(text) != "query":
        raise ReplayError(
            "not `nvidia-smi -q` output (no '==NVSMI LOG==' banner and 'Attached GPUs' line)"
        )
    root = _tree(text)
    top = _Section(root)
    driver = DriverInfo(
        driver_version=top.text("Driver Version"),
        cuda_driver_version=top.text("CUDA Version"),
        nvml_version=na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE_QUERY),
    )
    infos, states = [], []
    gpus = [n for n in root.children if n.value is None and re.match(r"GPU\s+\S+", n.label)]
    for index, node in enumerate(gpus):
        gpu = _Section(node)
        info = _query_info(gpu, node.label.split(None, 1)[1], index)
        infos.append(info)
        states.append(_query_state(gpu, info, timestamp))
    attached = top.num("Attached GPUs", as_int=True)
    if attached.ok and attached.value != len(infos):
        raise ReplayError(
            f"the text says {attached.value} GPUs are attached but holds {len(infos)}: "
            "paste the whole `nvidia-smi -q` output"
        )
    return SmiRecording(
        timestamp=str(top.text("Timestamp").get("")),
        driver=driver,
        infos=tuple(infos),
        states=tuple(states),
    )


# --- the plain nvidia-smi table -------------------------------------------------------------

_HEADER = re.compile(
    r"Driver Version:\s*(?P<driver>\S+)(?:\s+CUDA Version:\s*(?P<cuda>[^\s|]+))?", re.IGNORECASE
)
_ROW1 = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off)\s*\|"
    r"\s*(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s+(?P<disp>\S+)\s*\|"
    r"\s*(?P<ecc>\S+)\s*\|$"
)
_ROW2 = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<cap>\S+)\s*\|"
    r"\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|\s*(?P<util>\S+)\s+(?P<compute>.+?)\s*\|$"
)
_ROW3 = re.compile(r"^\|[^|]*\|[^|]*\|\s*(?P<mig>\S+)\s*\|$")
_PROCESS_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d+)\s+(?P<type>C\+G|C|G)\s+"
    r"(?P<name>.+?)\s+(?P<mem>\d+MiB|N/A)\s*\|$"
)


def _cell(
    text: str, *, scale: float = 1.0, as_int: bool = False, text_value: bool = False
) -> Reading[Any]:
    value = text.strip()
    if value.lower() in _NA_TEXTS:
        return na(Status.NOT_SUPPORTED, _PRINTED_NA, SOURCE_TABLE)
    if text_value:
        return ok(value, SOURCE_TABLE)
    return _convert(ok(value, SOURCE_TABLE), scale=scale, as_int=as_int, source=SOURCE_TABLE)


def _table_processes(lines: list[str]) -> dict[int, list[GpuProcess]]:
    out: dict[int, list[GpuProcess]] = {}
    for line in lines:
        match = _PROCESS_ROW.match(line.strip())
        if match is None:
            continue
        kind = match["type"]
        out.setdefault(int(match["gpu"]), []).append(
            GpuProcess(
                pid=int(match["pid"]),
                name=match["name"],
                kind=_PROCESS_KINDS.get(kind, kind.lower()),
                used_memory_bytes=_cell(match["mem"], scale=_MIB, as_int=True),
            )
        )
    return out


def parse_smi_table(text: str, *, timestamp: float = 0.0) -> SmiRecording:
    """Parse the plain ``nvidia-smi`` table. What the table does not show is N/A with a reason."""
    header = _HEADER.search(text)
    if looks_like_smi_text(text) != "table" or header is None:
        raise ReplayError("not `nvidia-smi` table output (no 'NVIDIA-SMI ... Driver Version' line)")
    lines = [line.strip() for line in text.splitlines()]
    first = next((line for line in lines if line), "")
    recorded = "" if first.startswith(("+", "|")) else first  # `date; nvidia-smi` puts it first
    missing = na(Status.NOT_AVAILABLE, _TABLE_ONLY, SOURCE_TABLE)
    gone = na(Status.NOT_AVAILABLE, "the table printed no value here", SOURCE_TABLE)
    processes = _table_processes(lines)
    has_process_table = any(line.startswith("| Processes:") for line in lines)
    infos, states = [], []
    for n, line in enumerate(lines):
        row1 = _ROW1.match(line)
        row2 = _ROW2.match(lines[n + 1]) if row1 and n + 1 < len(lines) else None
        if row1 is None or row2 is None:
            continue
        row3 = _ROW3.match(lines[n + 2]) if n + 2 < len(lines) else None
        mig_text = row3["mig"] if row3 else ""
        mig = (
            ok(mig_text.lower() == "enabled", SOURCE_TABLE)
            if mig_text.lower() in ("enabled", "disabled")
            else gone
        )
        name = row1["name"].strip()
        info = GpuInfo(
            index=int(row1["index"]),
            # The table cuts long names short ("NVIDIA GeForce RTX 4090 ..."); -q has them whole.
            name=gone if name.endswith("...") else ok(name, SOURCE_TABLE),
            uuid=missing,
            pci_bus_id=ok(row1["bus"].upper(), SOURCE_TABLE),
            architecture=missing,
            compute_capability=missing,
            sm_count=missing,
            memory_total_bytes=_cell(row2["total"], scale=_MIB, as_int=True),
            memory_bus_width_bits=missing,
            max_sm_clock_mhz=missing,
            max_memory_clock_mhz=missing,
            power_limit_w=_cell(row2["cap"]),
            default_power_limit_w=missing,
            persistence_mode=ok(row1["persistence"] == "On", SOURCE_TABLE),
            ecc_enabled=missing,  # the ECC column counts errors; "N/A" there may mean ECC off
            mig_enabled=mig,
            pcie=PcieLink(missing, missing, missing, missing),
            virtualization=missing,
        )
        util = (
            na(Status.NOT_AVAILABLE, MIG_UTILIZATION_REASON, SOURCE_TABLE)
            if mig.get(False)
            else _cell(row2["util"])
        )
        procs = processes.get(info.index, [])
        states.append(
            GpuState(
                timestamp=timestamp,
                gpu_util_pct=util,
                memory_util_pct=missing,
                memory_used_bytes=_cell(row2["used"], scale=_MIB, as_int=True),
                sm_clock_mhz=missing,
                memory_clock_mhz=missing,
                power_w=_cell(row2["power"]),
                temperature_c=_cell(row2["temp"]),
                performance_state=_cell(row2["perf"], text_value=True),
                clock_event_reasons=missing,
                pcie_rx_bytes_per_s=missing,
                pcie_tx_bytes_per_s=missing,
                nvlink_rx_bytes=missing,
                nvlink_tx_bytes=missing,
                ecc_uncorrected_volatile=_cell(row1["ecc"], as_int=True),
                retired_pages=missing,
                remapped_rows_uncorrectable=missing,
                row_remap_pending=missing,
                row_remap_failed=missing,
                processes=ok(tuple(procs), SOURCE_TABLE) if has_process_table else missing,
            )
        )
        infos.append(info)
    if not infos:
        raise ReplayError("the `nvidia-smi` table lists no GPU rows: paste the whole output")
    driver = DriverInfo(
        driver_version=ok(header["driver"], SOURCE_TABLE),
        cuda_driver_version=ok(header["cuda"], SOURCE_TABLE) if header["cuda"] else missing,
        nvml_version=missing,
    )
    return SmiRecording(recorded, driver, tuple(infos), tuple(states))


def parse_smi_text(text: str | bytes, *, timestamp: float = 0.0) -> SmiRecording:
    """Parse either text form of ``nvidia-smi`` output, detected from its banner."""
    decoded = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    kind = looks_like_smi_text(decoded)
    if kind == "query":
        return parse_smi_query_text(decoded, timestamp=timestamp)
    if kind == "table":
        return parse_smi_table(decoded, timestamp=timestamp)
    raise ReplayError(
        "not nvidia-smi text: expected the output of `nvidia-smi -q` (best) or `nvidia-smi`"
    )


def load_smi_text(path: str | Path) -> SmiRecording:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_smi_text(data)
