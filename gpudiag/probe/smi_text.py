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

from gpudiag._files import RECORDING_BYTES, read_bytes
from gpudiag._values import digits
from gpudiag.errors import ReplayError
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuProcess, GpuState, PcieLink
from gpudiag.probe.nvml_backend import MIG_UTILIZATION_REASON
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.probe.smi_query import (
    MIB,
    NA_TEXTS,
    NOT_IN_OUTPUT,
    PRINTED_NA,
    QueryReader,
    number_in,
    process,
)
from gpudiag.probe.smi_xml import SmiRecording

SOURCE_QUERY = "nvidia-smi -q text"
SOURCE_TABLE = "nvidia-smi table"
_QUERY_BANNER = "NVSMI LOG"
_TABLE_BANNER = re.compile(r"^\|\s*NVIDIA-SMI\s+\S+", re.MULTILINE)
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


class _Section(QueryReader):
    """One GPU's subtree of ``nvidia-smi -q`` (or a section inside one)."""

    source = SOURCE_QUERY
    form = 1

    def __init__(self, node: _Node) -> None:
        self.node = node

    def text_at(self, path: str) -> Reading[str]:
        found = self.node.find(path)
        if found is None or found.value is None:
            return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE_QUERY)
        value = found.value
        if value.lower() in NA_TEXTS or value.lower().startswith("requested functionality"):
            return na(Status.NOT_SUPPORTED, PRINTED_NA, SOURCE_QUERY)
        return ok(value, SOURCE_QUERY)

    def children(self, path: str) -> list[QueryReader]:
        parent, _, label = path.rpartition("/")
        section = self.node.find(parent) if parent else self.node
        return [] if section is None else [_Section(n) for n in section.find_all(label)]

    def child_names(self, path: str) -> list[str]:
        found = self.node.find(path)
        return [] if found is None else [child.label for child in found.children]

    def exists(self, path: str) -> bool:
        return self.node.find(path) is not None

    def printed_na(self, path: str) -> bool:
        found = self.node.find(path)  # "Remapped Rows : N/A"
        return found is not None and not found.children and (found.value or "").lower() in NA_TEXTS

    def clock_event_reasons(self) -> Reading[tuple[str, ...]]:
        for label in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
            section = self.node.find(label)
            if section is None:
                continue
            if section.value is not None and section.value.lower() in NA_TEXTS:
                return na(Status.NOT_SUPPORTED, PRINTED_NA, SOURCE_QUERY)
            seen = {
                _CLOCK_EVENT_LABELS[n.label.lower()]: (n.value or "").lower() == "active"
                for n in section.walk()
                if n.label.lower() in _CLOCK_EVENT_LABELS
            }
            if not seen:
                return na(
                    Status.NOT_SUPPORTED, "no clock event reasons in the recording", SOURCE_QUERY
                )
            order = list(_CLOCK_EVENT_LABELS.values())
            return ok(
                tuple(sorted((k for k, v in seen.items() if v), key=order.index)), SOURCE_QUERY
            )
        return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE_QUERY)

    def processes(self) -> Reading[tuple[GpuProcess, ...]]:
        node = self.node.find("Processes")
        if node is None:
            return na(Status.NOT_AVAILABLE, NOT_IN_OUTPUT, SOURCE_QUERY)
        out = []
        for p in node.find_all("Process ID"):
            if p.value is not None and digits(p.value.strip()):
                proc = _Section(p)
                out.append(
                    process(
                        int(p.value),
                        str(proc.text_at("Name").get("")),
                        str(proc.text_at("Type").get("C")),
                        proc.number_at("Used GPU Memory", scale=MIB, as_int=True),
                    )
                )
        return ok(tuple(out), SOURCE_QUERY)


def parse_smi_query_text(text: str, *, timestamp: float = 0.0) -> SmiRecording:
    """Parse ``nvidia-smi -q`` output; raises ReplayError when it is not such a text."""
    if looks_like_smi_text(text) != "query":
        raise ReplayError(
            "not `nvidia-smi -q` output (no '==NVSMI LOG==' banner and 'Attached GPUs' line)"
        )
    root = _tree(text)
    top = _Section(root)
    driver = DriverInfo(
        driver_version=top.text_at("Driver Version"),
        cuda_driver_version=top.text_at("CUDA Version"),
        nvml_version=na(Status.NOT_AVAILABLE, "not recorded by nvidia-smi -q", SOURCE_QUERY),
    )
    infos, states = [], []
    gpus = [n for n in root.children if n.value is None and re.match(r"GPU\s+\S+", n.label)]
    for index, node in enumerate(gpus):
        gpu = _Section(node)
        # The "GPU 00000000:18:00.0" header is the bus id.
        info = gpu.info(index, pci_bus_id=ok(node.label.split(None, 1)[1], SOURCE_QUERY))
        infos.append(info)
        states.append(gpu.state(info, timestamp))
    attached = top.number_at("Attached GPUs", as_int=True)
    if attached.ok and attached.value != len(infos):
        raise ReplayError(
            f"the text says {attached.value} GPUs are attached but holds {len(infos)}: "
            "paste the whole `nvidia-smi -q` output"
        )
    return SmiRecording(
        timestamp=str(top.text_at("Timestamp").get("")),
        driver=driver,
        infos=tuple(infos),
        states=tuple(states),
    )


# --- the plain nvidia-smi table -------------------------------------------------------------

_HEADER = re.compile(
    r"Driver Version:\s*(?P<driver>\S+)(?:\s+CUDA Version:\s*(?P<cuda>[^\s|]+))?", re.IGNORECASE
)
_ROW1 = re.compile(
    r"^\|\s*(?P<index>[0-9]+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off)\s*\|"
    r"\s*(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s+(?P<disp>\S+)\s*\|"
    r"\s*(?P<ecc>\S+)\s*\|$"
)
_ROW2 = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<cap>\S+)\s*\|"
    r"\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|\s*(?P<util>\S+)\s+(?P<compute>.+?)\s*\|$"
)
_ROW3 = re.compile(r"^\|[^|]*\|[^|]*\|\s*(?P<mig>\S+)\s*\|$")
_PROCESS_ROW = re.compile(
    r"^\|\s*(?P<gpu>[0-9]+)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>[0-9]+)\s+(?P<type>C\+G|C|G)\s+"
    r"(?P<name>.+?)\s+(?P<mem>[0-9]+MiB|N/A)\s*\|$"
)


def _cell(
    text: str, *, scale: float = 1.0, as_int: bool = False, text_value: bool = False
) -> Reading[Any]:
    value = text.strip()
    if value.lower() in NA_TEXTS:
        return na(Status.NOT_SUPPORTED, PRINTED_NA, SOURCE_TABLE)
    if text_value:
        return ok(value, SOURCE_TABLE)
    try:
        number = number_in(value) * scale
    except ValueError:
        return na(Status.UNKNOWN, f"unreadable value {value!r}", SOURCE_TABLE)
    return ok(round(number) if as_int else number, SOURCE_TABLE)


def _table_processes(lines: list[str]) -> dict[int, list[GpuProcess]]:
    out: dict[int, list[GpuProcess]] = {}
    for line in lines:
        match = _PROCESS_ROW.match(line.strip())
        if match is None:
            continue
        out.setdefault(int(match["gpu"]), []).append(
            process(
                int(match["pid"]),
                match["name"],
                match["type"],
                _cell(match["mem"], scale=MIB, as_int=True),
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
            memory_total_bytes=_cell(row2["total"], scale=MIB, as_int=True),
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
                memory_used_bytes=_cell(row2["used"], scale=MIB, as_int=True),
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
    data = read_bytes(path, "nvidia-smi recording", max_bytes=RECORDING_BYTES, error=ReplayError)
    return parse_smi_text(data)
