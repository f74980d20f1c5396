"""GPU topology: how each pair of GPUs is connected, whether they can reach each other's memory
directly (P2P), and which CPUs and NUMA node sit closest to each GPU.

Read live through the NVML chokepoint (``gpudiag.probe.topology_nvml``) or from recorded text:
``nvidia-smi topo -m`` (``parse_topo_matrix``) and ``nvidia-smi topo -p2p r``
(``parse_p2p_matrix``); ``load_topology`` reads either kind of file and merges them.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag._files import TOPOLOGY_BYTES, read_text
from gpudiag._values import digits
from gpudiag.errors import ReplayError

if TYPE_CHECKING:
    pass

SOURCE_NVML = "nvml"
SOURCE_TOPO_M = "nvidia-smi topo -m"
SOURCE_P2P = "nvidia-smi topo -p2p r"
SOURCE_RECORDING = "recording"

# Link kinds of `nvidia-smi topo -m`, farthest first: the index is the rank (0 = farthest).
# Meanings are nvidia-smi's own legend (recorded in tests/fixtures/topo-matrix/legend-topo-m.txt).
LINK_KINDS: tuple[str, ...] = ("SYS", "NODE", "PHB", "PXB", "PIX", "NV")
LINK_LEGEND: Mapping[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}
_LINK_WORDS: Mapping[str, str] = {
    "SYS": "across the CPU socket interconnect",
    "NODE": "across PCIe host bridges of one NUMA node",
    "PHB": "through the PCIe host bridge",
    "PXB": "through several PCIe bridges",
    "PIX": "through one PCIe switch",
}
# nvidia-smi before the NODE/SYS split (drivers of 2016 and older) printed SOC for SYS.
_LINK_ALIASES = {"SOC": "SYS"}

# `nvidia-smi topo -p2p` legend. "DR" appears in newer drivers' legend only.
P2P_LEGEND: Mapping[str, str] = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}
P2P_UNSUPPORTED = frozenset({"CNS", "GNS", "TNS", "NS", "DR"})

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_AFFINITY_COLUMNS = (
    (re.compile(r"CPU\s+Affinity", re.IGNORECASE), "CPU_Affinity"),
    (re.compile(r"NUMA\s+Affinity", re.IGNORECASE), "NUMA_Affinity"),
    (re.compile(r"GPU\s+NUMA\s+ID", re.IGNORECASE), "GPU_NUMA_ID"),
)
_AFFINITY_NAMES = frozenset(name for _, name in _AFFINITY_COLUMNS)
_GPU_NAME = re.compile(r"^GPU([0-9]+)$")
_NV = re.compile(r"^NV([0-9]+)$")
_LABEL = re.compile(r"^[A-Z][A-Z0-9]*$")
_CPULIST = re.compile(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
_NIC_LEGEND = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)")
_NA = frozenset({"", "N/A", "NA", "-"})


# -- cpulists ---------------------------------------------------------------------------------
def parse_cpulist(text: str) -> frozenset[int]:
    """CPU (or NUMA node) ids from Linux cpulist text, e.g. ``0-51,104-155``."""
    text = text.strip()
    if not _CPULIST.match(text):
        raise ValueError(f"not a CPU list: {text!r}")
    ids: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return frozenset(ids)


def format_cpulist(ids: Sequence[int] | frozenset[int] | set[int]) -> str:
    """The shortest cpulist text for ``ids``: ``{0, 1, 2, 5}`` -> ``0-2,5``."""
    ordered = sorted(set(ids))
    runs: list[str] = []
    start = prev = None
    for n in [*ordered, None]:
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ",".join(runs)


# -- records ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Link:
    """How two GPUs reach each other, in ``nvidia-smi topo -m`` words (``label``)."""

    label: str  # "NV12", "PHB", "SYS", ..., "X" for self, "?" when unknown

    @property
    def nvlinks(self) -> int:
        """Bonded NVLinks between the pair (the # of NV#), 0 without NVLink."""
        match = _NV.match(self.label)
        return int(match.group(1)) if match else 0

    @property
    def kind(self) -> str:
        """NV for any NVLink count, else the label itself."""
        return "NV" if self.nvlinks else self.label

    @property
    def rank(self) -> int | None:
        """0 for the farthest kind (SYS) up to 5 (NVLink); None for self or unknown."""
        return LINK_KINDS.index(self.kind) if self.kind in LINK_KINDS else None

    @property
    def is_nvlink(self) -> bool:
        return self.nvlinks > 0

    def describe(self) -> str:
        if self.is_nvlink:
            return f"NVLink ({self.label})"
        words = _LINK_WORDS.get(self.label)
        return f"{words} ({self.label})" if words else f"link {self.label}"


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """Where one GPU sits relative to the CPUs (``nvidia-smi topo -m``'s affinity columns)."""

    name: str  # "GPU0": the nvidia-smi / NVML index, not the CUDA index
    cpu_affinity: str = ""  # cpulist of the CPUs nearest the GPU; "" when unknown
    numa_affinity: str = ""  # NUMA nodes nearest the GPU; "" when unknown
    gpu_numa_id: int | None = None  # the GPU's own NUMA node (GPUs that are NUMA nodes)
    pci_bus_id: str = ""

    @property
    def index(self) -> int:
        match = _GPU_NAME.match(self.name)
        return int(match.group(1)) if match else -1

    @property
    def cpus(self) -> frozenset[int] | None:
        return parse_cpulist(self.cpu_affinity) if self.cpu_affinity else None

    @property
    def numa_nodes(self) -> frozenset[int] | None:
        return parse_cpulist(self.numa_affinity) if self.numa_affinity else None


@dataclass(frozen=True, slots=True)
class P2PMatrix:
    """``nvidia-smi topo -p2p`` output: a status code per ordered GPU pair ("X" on the diagonal)."""

    gpus: tuple[str, ...]
    status: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """The GPUs of one machine and how they connect.

    ``links`` and ``p2p`` are square matrices in GPU order (empty when unknown): link labels in
    ``nvidia-smi topo -m`` vocabulary and P2P read status codes of ``nvidia-smi topo -p2p r``.
    ``process_cpus`` is the cpulist this process may run on, read only on a live machine.
    ``notes`` say what could not be read and why.
    """

    gpus: tuple[GpuPlacement, ...]
    links: tuple[tuple[str, ...], ...] = ()
    p2p: tuple[tuple[str, ...], ...] = ()
    nics: tuple[str, ...] = ()
    nic_links: tuple[tuple[str, ...], ...] = ()  # per GPU, the link label to each NIC
    process_cpus: str = ""
    source: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for name, matrix in (("links", self.links), ("p2p", self.p2p)):
            if matrix and (len(matrix) != n or any(len(row) != n for row in matrix)):
                raise ReplayError(f"topology {name} matrix is not {n}x{n} for {n} GPUs")

    # -- questions --------------------------------------------------------------------------
    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def pairs(self) -> Iterator[tuple[int, int]]:
        """Each unordered GPU pair once, (0, 1), (0, 2), ..."""
        for i in range(self.gpu_count):
            for j in range(i + 1, self.gpu_count):
                yield i, j

    def link(self, i: int, j: int) -> Link:
        if i == j:
            return Link("X")
        return Link(self.links[i][j]) if self.links else Link("?")

    def p2p_status(self, i: int, j: int) -> str | None:
        """The P2P read status code of the pair, or None when not known."""
        if not self.p2p or i == j:
            return None
        code = self.p2p[i][j]
        return None if code in ("", "?") else code

    @property
    def has_nvlink(self) -> bool:
        return any(self.link(i, j).is_nvlink for i, j in self.pairs())

    def link_counts(self) -> Counter[str]:
        """How many GPU pairs have each link label."""
        return Counter(self.link(i, j).label for i, j in self.pairs())

    def numa_groups(self) -> dict[str, tuple[int, ...]]:
        """GPU indices by NUMA affinity text ("0" -> (0, 1, 2, 3)); GPUs with none are left out."""
        groups: dict[str, list[int]] = {}
        for n, gpu in enumerate(self.gpus):
            if gpu.numa_affinity:
                groups.setdefault(gpu.numa_affinity, []).append(n)
        return {k: tuple(v) for k, v in groups.items()}

    def placement(self, nvml_index: int) -> GpuPlacement | None:
        for gpu in self.gpus:
            if gpu.index == nvml_index:
                return gpu
        return None

    # -- words --------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: "8 GPUs, all pairs NVLink (NV18)", "2 GPUs through the PCIe host bridge
        (PHB), P2P not supported (CNS)"."""
        n = self.gpu_count
        head = f"{n} GPU{'s' if n != 1 else ''}"
        if n < 2:
            return head
        links = self._links_phrase()
        spaced = n == 2 and not links.startswith(("link kinds unknown", "links:"))
        text = f"{head} {links}" if spaced else f"{head}, {links}"
        p2p = self._p2p_phrase()
        if p2p:
            text += f", {p2p}"
        if self.nics:
            text += f", {len(self.nics)} NIC{'s' if len(self.nics) != 1 else ''}"
        return text

    def _links_phrase(self) -> str:
        if not self.links:
            return "link kinds unknown"
        counts = self.link_counts()
        if len(counts) == 1:
            link = Link(next(iter(counts)))
            if link.label == "?":
                return "link kinds unknown"
            if self.gpu_count == 2:
                return f"over {link.describe()}" if link.is_nvlink else link.describe()
            return f"all pairs {link.describe()}"
        ordered = sorted(counts, key=lambda lab: (-_rank(Link(lab)), -Link(lab).nvlinks))
        return "links: " + ", ".join(
            f"{counts[lab]} pair{'s' if counts[lab] != 1 else ''} {lab}" for lab in ordered
        )

    def _p2p_phrase(self) -> str:
        codes = Counter(self.p2p_status(i, j) or "?" for i, j in self.pairs())
        codes.pop("?", None)
        if not codes:
            return ""
        total = sum(codes.values())
        if set(codes) == {"OK"}:
            return "P2P OK"
        bad = sorted(c for c in codes if c != "OK")
        label = "/".join(bad)
        if "OK" not in codes:
            return "P2P unknown (U)" if bad == ["U"] else f"P2P not supported ({label})"
        return f"P2P OK on {codes['OK']} of {total} pairs ({label} on the others)"

    def lines(self) -> list[str]:
        """The summary, then where the GPUs sit (NUMA groups, CPUs), NICs and notes."""
        out = [self.summary()]
        groups = self.numa_groups()
        for numa, members in groups.items():
            cpus = self.gpus[members[0]].cpu_affinity
            where = f" (CPUs {cpus})" if cpus else ""
            indices = format_cpulist([self.gpus[m].index for m in members])
            out.append(f"NUMA {numa}: GPU {indices}{where}")
        if not groups and any(g.cpu_affinity for g in self.gpus):
            affinities = {g.cpu_affinity for g in self.gpus if g.cpu_affinity}
            out.append("CPU affinity: " + "; ".join(sorted(affinities)))
        if self.nics:
            out.append("NICs: " + ", ".join(self.nics))
        if self.process_cpus:
            out.append(f"this process may run on CPUs {self.process_cpus}")
        out.extend(f"note: {n}" for n in self.notes)
        return out

    def __repr__(self) -> str:
        return f"Topology({self.summary()}; source: {self.source or 'unknown'})"

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "source": self.source,
            "gpus": [dataclasses.asdict(g) for g in self.gpus],
            "links": [list(row) for row in self.links],
            "p2p": [list(row) for row in self.p2p],
            "nics": list(self.nics),
            "nic_links": [list(row) for row in self.nic_links],
            "process_cpus": self.process_cpus,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Inverse of ``to_dict`` (the ``topology`` of a gpudiag JSON snapshot)."""
        try:
            gpus = tuple(
                GpuPlacement(
                    name=str(g["name"]),
                    cpu_affinity=str(g.get("cpu_affinity", "")),
                    numa_affinity=str(g.get("numa_affinity", "")),
                    gpu_numa_id=None if g.get("gpu_numa_id") is None else int(g["gpu_numa_id"]),
                    pci_bus_id=str(g.get("pci_bus_id", "")),
                )
                for g in data["gpus"]
            )
            for text in (*(g.cpu_affinity for g in gpus), *(g.numa_affinity for g in gpus)):
                if text:
                    parse_cpulist(text)
            if data.get("process_cpus"):
                parse_cpulist(str(data["process_cpus"]))
            return cls(
                gpus=gpus,
                links=_matrix(data.get("links", [])),
                p2p=_matrix(data.get("p2p", [])),
                nics=tuple(str(n) for n in data.get("nics", [])),
                nic_links=_matrix(data.get("nic_links", [])),
                process_cpus=str(data.get("process_cpus", "")),
                source=str(data.get("source", "")),
                notes=tuple(str(n) for n in data.get("notes", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReplayError(
                f"the snapshot's topology is malformed: {type(exc).__name__}: {exc}"
            ) from None

    def with_p2p(self, matrix: P2PMatrix) -> Topology:
        """This topology with the P2P status of ``matrix`` (same GPUs, same order)."""
        names = tuple(g.name for g in self.gpus)
        if matrix.gpus != names:
            raise ReplayError(
                f"the P2P matrix lists {', '.join(matrix.gpus)} but the topology has "
                f"{', '.join(names)}: record both on the same machine"
            )
        source = f"{self.source} + {SOURCE_P2P}" if self.source else SOURCE_P2P
        return dataclasses.replace(
            self, p2p=matrix.status, source=source, notes=self.notes + matrix.notes
        )


def _rank(link: Link) -> int:
    return -1 if link.rank is None else link.rank


def _matrix(rows: Any) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(str(cell) for cell in row) for row in rows)


# -- recorded text ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Table:
    """A device matrix as printed by nvidia-smi: header columns and one row of cells per device."""

    devices: tuple[str, ...]  # device columns in header order (GPU0.., NIC0.., mlx5_0..)
    extras: tuple[str, ...]  # affinity columns after the devices
    rows: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]  # name -> (device cells, extras)
    nic_names: dict[str, str]  # NIC0 -> mlx5_0 from the "NIC Legend"

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if _GPU_NAME.match(d))


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).replace("\r", "").rstrip() for line in text.split("\n")]


def _read_table(text: str, what: str) -> _Table:
    if not isinstance(text, str):
        raise ReplayError(f"{what} must be text, not {type(text).__name__}")
    lines = _clean(text)
    start = next((n for n, line in enumerate(lines) if "GPU0" in line.split()), None)
    if start is None:
        raise ReplayError(
            f"no GPU matrix found (no header row with GPU0): is this `{what}` output? "
            f"Record it with `{what} > topo.txt` on the machine"
        )
    header = lines[start]
    for pattern, name in _AFFINITY_COLUMNS:
        header = pattern.sub(name, header)
    columns = header.split()
    devices = tuple(c for c in columns if c not in _AFFINITY_NAMES)
    extras = tuple(c for c in columns if c in _AFFINITY_NAMES)
    if columns[: len(devices)] != list(devices):
        raise ReplayError(f"`{what}` header has device columns after the affinity columns")
    rows: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    end = len(lines)
    for n in range(start + 1, len(lines)):
        tokens = lines[n].split()
        if not tokens or tokens[0] not in devices:
            end = n
            break
        cells = tuple(tokens[1 : 1 + len(devices)])
        if len(cells) < len(devices):
            raise ReplayError(
                f"`{what}` row {tokens[0]} has {len(cells)} cells for {len(devices)} devices: "
                "the matrix is truncated or not nvidia-smi output"
            )
        rows[tokens[0]] = (cells, tuple(tokens[1 + len(devices) :]))
    nic_names = {
        m.group(1): m.group(2) for line in lines[end:] if (m := _NIC_LEGEND.match(line)) is not None
    }
    table = _Table(devices, extras, rows, nic_names)
    missing = [g for g in table.gpu_names if g not in rows]
    if not table.gpu_names or missing:
        raise ReplayError(
            f"`{what}` output lacks the rows of {', '.join(missing) or 'every GPU'}: "
            "the matrix is truncated"
        )
    return table


def _gpu_cells(table: _Table) -> Iterator[tuple[int, int, str]]:
    gpus = table.gpu_names
    columns = [table.devices.index(g) for g in gpus]
    for i, gpu in enumerate(gpus):
        cells = table.rows[gpu][0]
        for j, column in enumerate(columns):
            yield i, j, cells[column]


def _looks_like_p2p(table: _Table) -> bool:
    off_diagonal = [cell for i, j, cell in _gpu_cells(table) if i != j]
    return bool(off_diagonal) and all(cell in P2P_LEGEND for cell in off_diagonal)


def _placement(name: str, extras: tuple[str, ...], values: tuple[str, ...]) -> GpuPlacement:
    fields: dict[str, str] = dict(zip(extras, values, strict=False))
    cpu = fields.get("CPU_Affinity", "")
    numa = fields.get("NUMA_Affinity", "")
    numa_id = fields.get("GPU_NUMA_ID", "")
    return GpuPlacement(
        name=name,
        cpu_affinity="" if cpu in _NA or not _CPULIST.match(cpu) else cpu,
        numa_affinity="" if numa in _NA or not _CPULIST.match(numa) else numa,
        gpu_numa_id=int(numa_id) if digits(numa_id) else None,
    )


def parse_topo_matrix(text: str) -> Topology:
    """Read ``nvidia-smi topo -m`` output into a Topology.

    Tolerant of what copies of it look like: TABs or runs of spaces, ANSI colour codes, a
    leading TAB or spaces, text before the header, NIC rows and columns (kept as ``nics``, named
    from the "NIC Legend" when present), the legend after the matrix (ignored), the
    "CPU Affinity", "NUMA Affinity" and "GPU NUMA ID" columns, and cpulists like
    ``0-51,104-155``. Raises ``ReplayError`` when the text holds no GPU matrix.
    """
    table = _read_table(text, SOURCE_TOPO_M)
    if _looks_like_p2p(table):
        raise ReplayError(
            "this is `nvidia-smi topo -p2p` output, not `nvidia-smi topo -m`: read it with "
            "parse_p2p_matrix (load_topology tells the two apart)"
        )
    gpus = table.gpu_names
    links = [["X"] * len(gpus) for _ in gpus]
    notes: list[str] = []
    for i, j, cell in _gpu_cells(table):
        label = _LINK_ALIASES.get(cell, cell)
        if i == j:
            if label != "X":
                raise ReplayError(f"`{SOURCE_TOPO_M}` shows {label!r} for {gpus[i]} with itself")
            continue
        if not _LABEL.match(label):
            raise ReplayError(
                f"`{SOURCE_TOPO_M}` cell {gpus[i]}/{gpus[j]} is {cell!r}, not a link kind "
                "(X, SYS, NODE, PHB, PXB, PIX or NV#)"
            )
        if not _NV.match(label) and label not in LINK_KINDS:
            note = f"unknown link kind {label!r} (this nvidia-smi is newer than gpudiag)"
            if note not in notes:
                notes.append(note)
        links[i][j] = label
    nic_columns = [(n, d) for n, d in enumerate(table.devices) if not _GPU_NAME.match(d)]
    placements = tuple(_placement(g, table.extras, table.rows[g][1]) for g in gpus)
    return Topology(
        gpus=placements,
        links=tuple(tuple(row) for row in links),
        nics=tuple(table.nic_names.get(d, d) for _, d in nic_columns),
        nic_links=tuple(tuple(table.rows[g][0][n] for n, _ in nic_columns) for g in gpus)
        if nic_columns
        else (),
        source=SOURCE_TOPO_M,
        notes=tuple(notes),
    )


def parse_p2p_matrix(text: str) -> P2PMatrix:
    """Read ``nvidia-smi topo -p2p r`` (or w/n/a/p) output: one status code per GPU pair.

    Codes follow nvidia-smi's legend (``P2P_LEGEND``): OK, CNS, GNS, TNS, NS, DR, U.
    Raises ``ReplayError`` when the text holds no P2P matrix.
    """
    table = _read_table(text, "nvidia-smi topo -p2p r")
    gpus = table.gpu_names
    status = [["X"] * len(gpus) for _ in gpus]
    notes: list[str] = []
    for i, j, cell in _gpu_cells(table):
        if i == j:
            continue
        if cell not in P2P_LEGEND:
            if _NV.match(cell) or cell in LINK_KINDS:
                raise ReplayError(
                    "this is `nvidia-smi topo -m` output, not `nvidia-smi topo -p2p`: read it "
                    "with parse_topo_matrix"
                )
            if not _LABEL.match(cell):
                raise ReplayError(f"P2P cell {gpus[i]}/{gpus[j]} is {cell!r}, not a P2P status")
            note = f"unknown P2P status {cell!r} (this nvidia-smi is newer than gpudiag)"
            if note not in notes:
                notes.append(note)
        status[i][j] = cell
    return P2PMatrix(gpus, tuple(tuple(row) for row in status), tuple(notes))


def _topology_from_p2p(matrix: P2PMatrix) -> Topology:
    return Topology(
        gpus=tuple(GpuPlacement(name) for name in matrix.gpus),
        p2p=matrix.status,
        source=SOURCE_P2P,
        notes=(*matrix.notes, "link kinds unknown: the recording has no `nvidia-smi topo -m`"),
    )


def load_topology(*paths: str | os.PathLike[str]) -> Topology:
    """Read recorded ``nvidia-smi topo -m`` and/or ``nvidia-smi topo -p2p r`` files of one
    machine (in any order) into one Topology."""
    if not paths:
        raise ReplayError("no topology file given: pass `nvidia-smi topo -m` output")
    matrix: Topology | None = None
    p2p: P2PMatrix | None = None
    for path in paths:
        p = Path(path)
        text = read_text(
            p, "topology file", max_bytes=TOPOLOGY_BYTES, error=ReplayError, replace=True
        )
        try:
            table = _read_table(text, SOURCE_TOPO_M)
            if _looks_like_p2p(table):
                p2p = parse_p2p_matrix(text)
            else:
                matrix = parse_topo_matrix(text)
        except ReplayError as exc:
            raise ReplayError(f"{p.name}: {exc}") from None
    if matrix is None:
        assert p2p is not None
        return _topology_from_p2p(p2p)
    return matrix.with_p2p(p2p) if p2p is not None else matrix


# -- live NVML ------------------------------------------------------------------------------
__all__ = [
    "LINK_KINDS",
    "LINK_LEGEND",
    "P2P_LEGEND",
    "GpuPlacement",
    "Link",
    "P2PMatrix",
    "Topology",
    "format_cpulist",
    "load_topology",
    "parse_cpulist",
    "parse_p2p_matrix",
    "parse_topo_matrix",
]
