"""GPU topology read live through the NVML chokepoint: the PCIe path and NVLinks between every
pair of GPUs, P2P status, each GPU's CPU and NUMA affinity, and this process's CPUs.

Every call goes through ``NvmlSession``: an NVML error becomes a note on the ``Topology``
("nvmlDeviceGetP2PStatus: not supported"), never an exception. Written against nvidia-ml-py's
documented API and tested against a fake fed from recorded ``nvidia-smi topo`` output;
untested on a real GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.probe.readings import Reading, Status
from gpudiag.probe.topology import (
    SOURCE_NVML,
    GpuPlacement,
    Topology,
    format_cpulist,
)

if TYPE_CHECKING:
    from gpudiag.probe.nvml import NvmlSession

# nvmlGpuTopologyLevel_t name -> topo -m label. INTERNAL is two GPUs on one board (Tesla K80),
# behind the board's own PCIe switch, which topo -m prints as a single-bridge path.
_NVML_LEVELS: tuple[tuple[str, str], ...] = (
    ("NVML_TOPOLOGY_INTERNAL", "PIX"),
    ("NVML_TOPOLOGY_SINGLE", "PIX"),
    ("NVML_TOPOLOGY_MULTIPLE", "PXB"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", "PHB"),
    ("NVML_TOPOLOGY_NODE", "NODE"),
    ("NVML_TOPOLOGY_SYSTEM", "SYS"),
)
_NVML_LEVEL_DEFAULTS = {
    "NVML_TOPOLOGY_INTERNAL": 0,
    "NVML_TOPOLOGY_SINGLE": 10,
    "NVML_TOPOLOGY_MULTIPLE": 20,
    "NVML_TOPOLOGY_HOSTBRIDGE": 30,
    "NVML_TOPOLOGY_NODE": 40,
    "NVML_TOPOLOGY_SYSTEM": 50,
}
# nvmlGpuP2PStatus_t name -> topo -p2p code.
_NVML_P2P: tuple[tuple[str, int, str], ...] = (
    ("NVML_P2P_STATUS_OK", 0, "OK"),
    ("NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED", 1, "CNS"),
    ("NVML_P2P_STATUS_GPU_NOT_SUPPORTED", 2, "GNS"),
    ("NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED", 3, "TNS"),
    ("NVML_P2P_STATUS_DISABLED_BY_REGKEY", 4, "DR"),
    ("NVML_P2P_STATUS_NOT_SUPPORTED", 5, "NS"),
    ("NVML_P2P_STATUS_UNKNOWN", 6, "U"),
)
_CPUSET_WORD_BITS = 64  # nvmlDeviceGetCpuAffinity: 64 CPUs per unsigned long on 64-bit hosts
# Room for 1024 CPU ids at least: ids can exceed os.cpu_count() (offline CPUs, containers).
_CPUSET_MIN_WORDS = 16
_NODESET_WORDS = 4  # room for 256 NUMA nodes


def _bus_key(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id in either NVML spelling
    ("00000000:07:00.0" or "0000:07:00.0")."""
    match = re.search(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", text)
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return int(domain, 16), int(bus, 16), int(device, 16), int(function)


def _pci_text(pci: Any) -> str:
    bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", "")
    if isinstance(bus, bytes):
        bus = bus.decode("ascii", errors="replace")
    return str(bus).rstrip("\x00").upper()


def _bits(words: Any) -> list[int]:
    """Set bit positions of a ctypes array of 64-bit words (NVML cpu and node sets)."""
    out: list[int] = []
    for w, word in enumerate(words):
        value = int(word)
        out.extend(w * _CPUSET_WORD_BITS + b for b in range(_CPUSET_WORD_BITS) if value >> b & 1)
    return out


def process_cpu_affinity() -> str:
    """The CPUs this process may run on (``os.sched_getaffinity``), "" where the OS lacks it."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return ""
    try:
        return format_cpulist(getter(0))
    except OSError:
        return ""


class _Notes:
    """N/A reasons, one per NVML function, in the order first seen."""

    def __init__(self) -> None:
        self.by_function: dict[str, str] = {}

    def add(self, function: str, reading: Reading[Any], what: str) -> None:
        if function not in self.by_function:
            self.by_function[function] = f"{what}: N/A ({reading.reason or reading.status.value})"

    def as_tuple(self) -> tuple[str, ...]:
        return tuple(self.by_function.values())


@dataclass(frozen=True, slots=True)
class _NvLinks:
    """Active NVLinks of one GPU: bus ids of the GPUs they reach, and how many reach a switch."""

    to_gpus: tuple[tuple[int, int, int, int] | None, ...] = ()
    to_switch: int = 0


def _nvlinks(session: NvmlSession, h: Any, gpu_buses: set[Any], notes: _Notes) -> _NvLinks:
    switch_type = session.const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    gpu_type = session.const("NVML_NVLINK_DEVICE_TYPE_GPU", 0)
    to_gpus: list[tuple[int, int, int, int] | None] = []
    to_switch = 0
    for link in range(int(session.const("NVML_NVLINK_MAX_LINKS", 18))):
        state = session.call("nvmlDeviceGetNvLinkState", h, link)
        if not state.ok and link == 0:
            # NOT_SUPPORTED on link 0 means no NVLink at all.
            if state.status is not Status.NOT_SUPPORTED:
                notes.add("nvmlDeviceGetNvLinkState", state, "NVLink state")
            break
        if not state.ok or not state.value:
            continue  # a link index the board lacks, or one that is down
        remote = session.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if not remote.ok:
            notes.add("nvmlDeviceGetNvLinkRemotePciInfo", remote, "NVLink peers")
            continue
        bus = _bus_key(_pci_text(remote.value))
        kind = session.call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        if kind.ok:
            is_switch = kind.value == switch_type
            is_gpu = kind.value == gpu_type
        else:  # drivers before the call: a peer that is none of our GPUs is a switch
            is_gpu = bus in gpu_buses
            is_switch = not is_gpu
        if is_switch:
            to_switch += 1
        elif is_gpu:
            to_gpus.append(bus)
    return _NvLinks(tuple(to_gpus), to_switch)


def _nvlink_count(a: _NvLinks, b: _NvLinks, bus_a: Any, bus_b: Any) -> int:
    """NVLinks joining two GPUs: direct links, plus the links both have into NVSwitches (every
    GPU of an NVSwitch board reaches every other through all of its switch links)."""
    direct = sum(1 for bus in a.to_gpus if bus is not None and bus == bus_b)
    direct = max(direct, sum(1 for bus in b.to_gpus if bus is not None and bus == bus_a))
    via_switch = min(a.to_switch, b.to_switch)
    return direct + via_switch


def _level_label(session: NvmlSession, level: int) -> str:
    for name, label in _NVML_LEVELS:
        if session.const(name, _NVML_LEVEL_DEFAULTS[name]) == level:
            return label
    return "?"


def _p2p_code(session: NvmlSession, status: int) -> str:
    for name, default, code in _NVML_P2P:
        if session.const(name, default) == status:
            return code
    return "U"


def _p2p_read_index(session: NvmlSession) -> int:
    # nvidia-ml-py 13.x defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) (a trailing comma in
    # the bindings); ctypes cannot pass a tuple, so take its element.
    index = session.const("NVML_P2P_CAPS_INDEX_READ", 0)
    if isinstance(index, tuple):
        index = index[0] if index else 0
    return int(index)


def _placement_nvml(session: NvmlSession, name: str, h: Any, notes: _Notes) -> GpuPlacement:
    words = max(_CPUSET_MIN_WORDS, -(-(os.cpu_count() or 1) // _CPUSET_WORD_BITS))
    cpus = session.call("nvmlDeviceGetCpuAffinity", h, words)
    if not cpus.ok:
        notes.add("nvmlDeviceGetCpuAffinity", cpus, "CPU affinity")
    scope = session.const("NVML_AFFINITY_SCOPE_NODE", 0)
    nodes = session.call("nvmlDeviceGetMemoryAffinity", h, _NODESET_WORDS, scope)
    if not nodes.ok:
        notes.add("nvmlDeviceGetMemoryAffinity", nodes, "NUMA affinity")
    numa_id = session.call("nvmlDeviceGetNumaNodeId", h)
    pci = session.call("nvmlDeviceGetPciInfo", h)
    cpu_ids = _bits(cpus.value) if cpus.ok else []
    node_ids = _bits(nodes.value) if nodes.ok else []
    return GpuPlacement(
        name=name,
        cpu_affinity=format_cpulist(cpu_ids),
        numa_affinity=format_cpulist(node_ids),
        gpu_numa_id=int(numa_id.get(0)) if numa_id.ok else None,
        pci_bus_id=_pci_text(pci.value) if pci.ok else "",
    )


def from_nvml(
    session: NvmlSession, handles: Sequence[Any | None], *, process_cpus: str | None = None
) -> Topology:
    """The live topology of the GPUs behind ``handles`` (NVML order; None for a GPU whose
    handle could not be read), every call through ``session`` so failures become notes.

    Untested on a real GPU: written against nvidia-ml-py's documented API
    (``nvmlDeviceGetTopologyCommonAncestor``, ``nvmlDeviceGetP2PStatus`` with
    ``NVML_P2P_CAPS_INDEX_READ``, ``nvmlDeviceGetNvLinkState`` / ``...RemotePciInfo`` /
    ``...RemoteDeviceType``, ``nvmlDeviceGetCpuAffinity``, ``nvmlDeviceGetMemoryAffinity``,
    ``nvmlDeviceGetNumaNodeId``) and run in tests against fake bindings fed from recorded
    ``nvidia-smi topo -m`` output. A pair with NVLinks is labelled NV# like ``topo -m`` does;
    links into NVSwitches count for every pair of switch-connected GPUs.
    ``process_cpus`` defaults to this process's ``os.sched_getaffinity``.
    """
    notes = _Notes()
    n = len(handles)
    names = [f"GPU{i}" for i in range(n)]
    placements = [
        _placement_nvml(session, names[i], h, notes) if h is not None else GpuPlacement(names[i])
        for i, h in enumerate(handles)
    ]
    buses = [_bus_key(p.pci_bus_id) for p in placements]
    gpu_buses = {b for b in buses if b is not None}
    nvlinks = [
        _nvlinks(session, h, gpu_buses, notes) if h is not None else _NvLinks() for h in handles
    ]
    links = [["X" if i == j else "?" for j in range(n)] for i in range(n)]
    p2p = [["X" if i == j else "?" for j in range(n)] for i in range(n)]
    read_index = _p2p_read_index(session)
    for i in range(n):
        for j in range(n):
            hi, hj = handles[i], handles[j]
            if i == j or hi is None or hj is None:
                continue
            if i < j:
                links[i][j] = links[j][i] = _pair_label(
                    session, hi, hj, nvlinks[i], nvlinks[j], buses[i], buses[j], notes
                )
            status = session.call("nvmlDeviceGetP2PStatus", hi, hj, read_index)
            if status.ok:
                p2p[i][j] = _p2p_code(session, int(status.get(-1)))
            else:
                notes.add("nvmlDeviceGetP2PStatus", status, "P2P status")
    missing = [names[i] for i, h in enumerate(handles) if h is None]
    extra = (
        (f"no NVML handle for {', '.join(missing)}: their links are unknown",) if missing else ()
    )
    any_p2p = any(cell not in ("X", "?") for row in p2p for cell in row)
    return Topology(
        gpus=tuple(placements),
        links=tuple(tuple(row) for row in links),
        p2p=tuple(tuple(row) for row in p2p) if any_p2p else (),
        process_cpus=process_cpu_affinity() if process_cpus is None else process_cpus,
        source=SOURCE_NVML,
        notes=extra + notes.as_tuple(),
    )


def _pair_label(
    session: NvmlSession,
    hi: Any,
    hj: Any,
    links_i: _NvLinks,
    links_j: _NvLinks,
    bus_i: Any,
    bus_j: Any,
    notes: _Notes,
) -> str:
    count = _nvlink_count(links_i, links_j, bus_i, bus_j)
    if count:
        return f"NV{count}"
    level = session.call("nvmlDeviceGetTopologyCommonAncestor", hi, hj)
    if not level.ok:
        notes.add("nvmlDeviceGetTopologyCommonAncestor", level, "PCIe path between GPUs")
        return "?"
    return _level_label(session, int(level.get(-1)))
