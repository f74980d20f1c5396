"""Reads NCCL topology XML: dumps NCCL writes (``NCCL_TOPO_DUMP_FILE``) and the static files
cloud vendors ship for ``NCCL_TOPO_FILE``, summarised as GPUs, NICs, sockets and links.

Format facts (NCCL's ``src/graph/xml.cc`` writes them): ``<cpu numaid affinity>`` holds ``<pci>``
trees; a GPU is a ``<pci>`` with a ``<gpu dev sm rank gdr>`` child whose ``<nvlink target count>``
children name the peer's PCI bus id and the link count; a NIC is a ``<nic>`` of ``<net name
speed gdr>`` with ``speed`` in Mb/s; ``affinity`` is a Linux cpumask (comma-separated 32-bit hex
words, most significant first). Static files often list only ``<pci>`` elements by PCI class
(0x0302/0x0300 GPU, 0x0207 InfiniBand, 0x0200 Ethernet, 0x0604 PCIe bridge/switch).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpudiag._files import TOPO_XML_BYTES, read_bytes
from gpudiag.errors import ReplayError
from gpudiag.probe.topology import format_cpulist

_GPU_CLASSES = ("0x0302", "0x0300")
_NIC_CLASSES = ("0x0207", "0x0200")
_BRIDGE_CLASS = "0x0604"


@dataclass(frozen=True, slots=True)
class NcclCpu:
    """One ``<cpu>`` element: a NUMA node and the CPUs of its affinity mask."""

    numa_id: int | None
    cpus: str  # cpulist; "" when the file gives no affinity
    vendor: str = ""
    model_id: str = ""


@dataclass(frozen=True, slots=True)
class NcclGpu:
    pci_bus_id: str
    numa_id: int | None
    dev: int | None = None  # NCCL's device index (dumps only)
    sm: int | None = None  # compute capability x 10
    gdr: bool | None = None  # GPUDirect RDMA usable
    device_id: str = ""  # PCI device id, e.g. 0x20b0 (A100-SXM4-40GB)
    link_speed: str = ""  # as written, e.g. "16.0 GT/s PCIe"; "" in some VMs
    link_width: int | None = None
    nvlinks: tuple[tuple[str, int], ...] = ()  # (peer PCI bus id, link count)


@dataclass(frozen=True, slots=True)
class NcclNic:
    name: str  # "mlx5_0", or the PCI bus id in static files
    numa_id: int | None
    speed_gbps: float | None = None
    gdr: bool | None = None


@dataclass(frozen=True, slots=True)
class NcclTopology:
    """One NCCL topology file. ``kind`` is "dump" (NCCL wrote it: ``<gpu>`` elements) or
    "static" (a hand-written ``NCCL_TOPO_FILE``: PCI classes only)."""

    kind: str
    cpus: tuple[NcclCpu, ...]
    gpus: tuple[NcclGpu, ...]
    nics: tuple[NcclNic, ...]
    pci_switches: int
    pci_unclassified: int = 0  # leaf <pci> elements without a class (static files)
    notes: tuple[str, ...] = ()

    def nvlinks_between(self, a: NcclGpu, b: NcclGpu) -> int:
        """NVLinks a lists towards b (0 when it lists none)."""
        return sum(count for target, count in a.nvlinks if _same_bus(target, b.pci_bus_id))

    def pair_nvlinks(self) -> Counter[int]:
        """How many GPU pairs have each NVLink count (0 = no NVLink)."""
        counts: Counter[int] = Counter()
        for n, a in enumerate(self.gpus):
            for b in self.gpus[n + 1 :]:
                counts[max(self.nvlinks_between(a, b), self.nvlinks_between(b, a))] += 1
        return counts

    def summary(self) -> str:
        parts = [f"NCCL topology {'dump' if self.kind == 'dump' else 'file (static)'}:"]
        sms = sorted({g.sm for g in self.gpus if g.sm is not None})
        sm = f" (sm {', '.join(map(str, sms))})" if sms else ""
        parts.append(
            f"{_count(len(self.gpus), 'GPU')}{sm} on {_count(len(self.cpus), 'NUMA node')}"
        )
        pairs = self.pair_nvlinks()
        if pairs and set(pairs) != {0}:
            if len(pairs) == 1:
                parts.append(f", NVLink between every GPU pair ({next(iter(pairs))} links)")
            else:
                parts.append(
                    ", NVLink on " + ", ".join(f"{n} pairs x{k}" for k, n in pairs.items())
                )
        elif len(self.gpus) > 1 and self.kind == "dump":
            parts.append(", no NVLink")
        if self.pci_switches:
            parts.append(f", {_count(self.pci_switches, 'PCIe switch', 'es')}")
        speeds = Counter(n.speed_gbps for n in self.nics if n.speed_gbps is not None)
        if speeds:
            by_speed = ", ".join(f"{k}x {v:g} Gb/s" for v, k in sorted(speeds.items()))
            parts.append(f", {_count(len(self.nics), 'NIC')} ({by_speed})")
        elif self.nics:
            parts.append(f", {_count(len(self.nics), 'NIC')}")
        if self.pci_unclassified:
            parts.append(f", {_count(self.pci_unclassified, 'PCI device')} of unknown class")
        gdr = {n.gdr for n in self.nics if n.gdr is not None}
        if gdr == {True}:
            parts.append(", GPUDirect RDMA on")
        elif gdr == {False}:
            parts.append(", GPUDirect RDMA off")
        return " ".join(parts[:2]) + "".join(parts[2:])


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


def cpumask_to_cpulist(mask: str) -> str:
    """Linux cpumask text ("000000ff,ffff0000,00ffffff") as a cpulist ("0-23,48-71")."""
    words = [w.strip() for w in mask.split(",")]
    value = int("".join(w.zfill(8) for w in words) or "0", 16)
    return format_cpulist([bit for bit in range(value.bit_length()) if value >> bit & 1])


# A real NCCL topology nests under 10 levels.
MAX_XML_DEPTH = 64


def _deeper_than(root: ET.Element, limit: int) -> bool:
    """Whether the tree nests more than ``limit`` levels (iterative: no recursion to exhaust
    before the recursive walk below runs)."""
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in element)
    return False


def _same_bus(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _int(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _flag(text: str | None) -> bool | None:
    value = _int(text)
    return None if value is None else value != 0


def _walk(el: ET.Element, numa: int | None, out: dict[str, list[object]]) -> None:
    for child in el:
        if child.tag == "pci":
            _pci(child, numa, out)
        elif child.tag == "nic":
            _nets(child, numa, out)
        else:
            _walk(child, numa, out)


def _nets(nic: ET.Element, numa: int | None, out: dict[str, list[object]]) -> None:
    for net in nic.iter("net"):
        speed = _int(net.get("speed"))
        out["nics"].append(
            NcclNic(
                name=net.get("name", "?"),
                numa_id=numa,
                speed_gbps=None if speed is None else speed / 1000,
                gdr=_flag(net.get("gdr")),
            )
        )


def _pci(pci: ET.Element, numa: int | None, out: dict[str, list[object]]) -> None:
    cls = pci.get("class", "").lower()
    gpu = pci.find("gpu")
    if gpu is not None or cls.startswith(_GPU_CLASSES):
        out["gpus"].append(
            NcclGpu(
                pci_bus_id=pci.get("busid", ""),
                numa_id=numa,
                dev=_int(gpu.get("dev")) if gpu is not None else None,
                sm=_int(gpu.get("sm")) if gpu is not None else None,
                gdr=_flag(gpu.get("gdr")) if gpu is not None else None,
                device_id=pci.get("device", ""),
                link_speed=pci.get("link_speed", ""),
                link_width=_int(pci.get("link_width")),
                nvlinks=tuple(
                    (link.get("target", ""), _int(link.get("count")) or 0)
                    for link in (gpu.findall("nvlink") if gpu is not None else [])
                ),
            )
        )
        return
    if cls.startswith(_BRIDGE_CLASS) or (not cls and pci.find("pci") is not None):
        out["switches"].append(pci)  # a PCIe switch, or a class-less group of devices
    elif not cls and len(pci) == 0:
        out["unclassified"].append(pci)
    if cls.startswith(_NIC_CLASSES) and pci.find(".//net") is None:
        out["nics"].append(NcclNic(name=pci.get("busid", "?"), numa_id=numa))
    _walk(pci, numa, out)


def parse_nccl_topo_xml(path: str | os.PathLike[str]) -> NcclTopology:
    """Summarise an NCCL topology XML file; ``ReplayError`` for graph files and broken XML."""
    p = Path(path)
    data = read_bytes(p, "NCCL topology", max_bytes=TOPO_XML_BYTES, error=ReplayError)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ReplayError(f"{p.name} is not valid XML: {exc}") from None
    if _deeper_than(root, MAX_XML_DEPTH):
        raise ReplayError(
            f"{p.name} nests elements more than {MAX_XML_DEPTH} deep: not an NCCL topology "
            "(a real one is under 10 deep)"
        )
    if root.tag == "graphs":
        raise ReplayError(
            f"{p.name} is an NCCL graph file (NCCL_GRAPH_DUMP_FILE: ring/tree channels), not a "
            "topology: dump the topology with NCCL_TOPO_DUMP_FILE"
        )
    if root.tag != "system":
        raise ReplayError(f"{p.name} is not an NCCL topology (root <{root.tag}>, not <system>)")
    out: dict[str, list[object]] = {"gpus": [], "nics": [], "switches": [], "unclassified": []}
    cpus = []
    for cpu in root.iter("cpu"):
        numa = _int(cpu.get("numaid"))
        mask = cpu.get("affinity", "")
        cpus.append(
            NcclCpu(
                numa_id=numa,
                cpus=cpumask_to_cpulist(mask) if mask else "",
                vendor=cpu.get("vendor", ""),
                model_id=cpu.get("modelid", ""),
            )
        )
        _walk(cpu, numa, out)
    gpus = tuple(g for g in out["gpus"] if isinstance(g, NcclGpu))
    notes = []
    if not gpus:
        notes.append("the file lists no GPUs (static files may leave them to NCCL's detection)")
    for gpu in gpus:
        if any(_same_bus(target, gpu.pci_bus_id) for target, _ in gpu.nvlinks):
            notes.append(f"GPU {gpu.pci_bus_id} lists an NVLink to itself (as NCCL saw it)")
    return NcclTopology(
        kind="dump" if any(g.sm is not None for g in gpus) else "static",
        cpus=tuple(cpus),
        gpus=gpus,
        nics=tuple(n for n in out["nics"] if isinstance(n, NcclNic)),
        pci_switches=len(out["switches"]),
        pci_unclassified=len(out["unclassified"]),
        notes=tuple(notes),
    )


__all__ = ["NcclCpu", "NcclGpu", "NcclNic", "NcclTopology", "parse_nccl_topo_xml"]
