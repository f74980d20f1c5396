"""The GPU spec table: peak TFLOP/s per dtype, memory, interconnect, and name matching
(NVIDIA by NVML name; AMD Instinct by the name and size a trace records)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from types import MappingProxyType
from typing import Any

from gpudiag._report import card, html_table, jsonable
from gpudiag.specs._cc import ComputeCapability, SpecsError, parse_compute_capability

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU product's published figures (see ``gpus.json`` for units and conventions).

    ``peak_tflops`` holds DENSE peaks (no structured sparsity) keyed by ``DTYPES``; int8 is in
    TOPS. fp16/bf16 are the fp32-accumulate rates (half the quoted figure on GeForce cards).
    A missing key means the card's tensor cores do not take that dtype.
    """

    key: str
    name: str
    architecture: str
    compute_capability: ComputeCapability
    sm_count: int
    memory_bytes: int
    memory_bandwidth_gbps: float
    memory_bus_width_bits: int
    peak_tflops: Mapping[str, float]
    nvlink_bandwidth_gbps: float | None
    pcie_gen: int | None
    tdp_w: float | None
    source: str
    memory_type: str | None = None
    notes: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # CPU<->GPU bandwidth per direction when the host link is NVLink-C2C, not PCIe (GH200).
    c2c_bandwidth_gbps: float | None = None
    derived: bool = False  # True when built from live readings, not from the table
    # "amd": an AMD Instinct row (gpus.json's "amd" note): sm_count is compute units and
    # compute_capability is HIP's gcnArch major.minor, not a CUDA compute capability.
    vendor: str = "nvidia"

    def peak_tflops_for(self, dtype: str) -> float | None:
        """The dense peak for ``dtype`` (TFLOP/s; TOPS for int8), None when there is none."""
        if dtype not in DTYPES:
            raise SpecsError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}.")
        return self.peak_tflops.get(dtype)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / _GIB

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}
        out["compute_capability"] = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        out["peak_tflops"] = dict(self.peak_tflops)
        return out

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        peaks = ", ".join(f"{k} {v:g}" for k, v in self.peak_tflops.items())
        return (
            f"GpuSpec({self.name!r}, cc {major}.{minor} {self.architecture}, {self.sm_count} SMs, "
            f"{self.memory_gib:.0f} GiB @ {self.memory_bandwidth_gbps:g} GB/s, "
            f"dense TFLOP/s: {peaks or 'n/a'})"
        )

    def _repr_html_(self) -> str:
        major, minor = self.compute_capability
        rows: list[tuple[object, object]] = [
            ("architecture", f"{self.architecture} (cc {major}.{minor})"),
            ("SMs", self.sm_count),
            ("memory", f"{self.memory_gib:.0f} GiB {self.memory_type or ''}".strip()),
            ("memory bandwidth", f"{self.memory_bandwidth_gbps:g} GB/s"),
            ("memory bus", f"{self.memory_bus_width_bits} bit"),
        ]
        rows += [
            (f"peak {k} (dense)", f"{v:g} {'TOPS' if k == 'int8' else 'TFLOP/s'}")
            for k, v in self.peak_tflops.items()
        ]
        rows += [
            (
                "NVLink",
                "none"
                if self.nvlink_bandwidth_gbps is None
                else f"{self.nvlink_bandwidth_gbps:g} GB/s",
            ),
            ("PCIe gen", self.pcie_gen if self.pcie_gen is not None else "?"),
            ("TDP", f"{self.tdp_w:g} W" if self.tdp_w is not None else "?"),
            ("source", self.source),
        ]
        if self.notes:
            rows.append(("notes", self.notes))
        return card(self.name, html_table(rows), subtitle=self.key)


# --- loading -----------------------------------------------------------------------------


def _resolve(row: Mapping[str, Any], by_key: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    base_key = row.get("base")
    if base_key is None:
        return dict(row)
    if base_key not in by_key:
        raise SpecsError(f"gpus.json: row {row['key']!r} names unknown base {base_key!r}")
    merged = _resolve(by_key[base_key], by_key)
    merged.update({k: v for k, v in row.items() if k != "base"})
    return merged


def _spec(row: Mapping[str, Any]) -> GpuSpec:
    peaks = {k: float(v) for k, v in row["peak_tflops"].items()}
    unknown = set(peaks) - set(DTYPES)
    if unknown:
        raise SpecsError(f"gpus.json: row {row['key']!r} has unknown dtypes {sorted(unknown)}")
    nvlink = row.get("nvlink_bandwidth_gbps")
    tdp = row.get("tdp_w")
    c2c = row.get("c2c_bandwidth_gbps")
    return GpuSpec(
        key=row["key"],
        name=row["name"],
        architecture=row["architecture"],
        compute_capability=parse_compute_capability(row["compute_capability"]),
        sm_count=int(row["sm_count"]),
        memory_bytes=round(float(row["memory_gib"]) * _GIB),
        memory_bandwidth_gbps=float(row["memory_bandwidth_gbps"]),
        memory_bus_width_bits=int(row["memory_bus_width_bits"]),
        peak_tflops=MappingProxyType({k: peaks[k] for k in DTYPES if k in peaks}),
        nvlink_bandwidth_gbps=None if nvlink is None else float(nvlink),
        pcie_gen=row.get("pcie_gen"),
        tdp_w=None if tdp is None else float(tdp),
        source=row["source"],
        memory_type=row.get("memory_type"),
        notes=row.get("notes", ""),
        aliases=tuple(row.get("aliases", ())),
        c2c_bandwidth_gbps=None if c2c is None else float(c2c),
        vendor=str(row.get("vendor", "nvidia")),
    )


@functools.cache
def _load() -> tuple[tuple[GpuSpec, ...], dict[str, GpuSpec]]:
    text = resources.files("gpudiag.specs").joinpath("gpus.json").read_text("utf-8")
    rows = json.loads(text)["gpus"]
    by_key = {row["key"]: row for row in rows}
    specs = tuple(_spec(_resolve(row, by_key)) for row in rows)
    index: dict[str, GpuSpec] = {}
    for spec in specs:
        if spec.vendor != "nvidia":
            continue
        for alias in (spec.name, spec.key, *spec.aliases):
            token = _normalize(alias)
            other = index.get(token)
            if other is not None and other.key != spec.key:
                raise SpecsError(f"gpus.json: {alias!r} names both {other.key} and {spec.key}")
            index[token] = spec
    return specs, index


def all_gpus() -> tuple[GpuSpec, ...]:
    """Every row of the spec table, in file order (NVIDIA's oldest architecture first, then
    AMD's)."""
    return _load()[0]


@functools.cache
def _amd_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in all_gpus():
        if spec.vendor == "amd":
            for alias in (spec.name, spec.key, *spec.aliases):
                index[_normalize(alias)] = spec
    return index


# --- name matching -----------------------------------------------------------------------

# Brand words NVML/nvidia-smi put in front of the model; the model words alone identify a row.
_BRAND_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
# vGPU profiles ("GRID A100-10C", "GRID P4-1Q"): the board family -> the row it runs on. The
# A100 profiles without "D" are the 40 GB boards' (NVIDIA vGPU docs), "A100D" the 80 GB ones.
_VGPU_FAMILIES: Mapping[str, str] = MappingProxyType(
    {
        "p4": "tesla-p4",
        "t4": "t4",
        "a10": "a10",
        "a30": "a30",
        "a100": "a100-pcie-40gb",
        "a100d": "a100-pcie-80gb",
        "l4": "l4",
        "l40": "l40",
        "l40s": "l40s",
        "h100": "h100-pcie-80gb",
    }
)


def _normalize(name: str) -> str:
    """Order-free token key: 'NVIDIA A100-PCIE-40GB' and 'A100 40GB PCIe' -> same key."""
    text = name.lower().replace("\u00a0", " ")
    text = re.sub(r"[-_/,()]+", " ", text)
    text = re.sub(r"(\d+)\s+gb\b", r"\1gb", text)
    tokens = [t for t in text.split() if t not in _BRAND_WORDS]
    return " ".join(sorted(tokens))


def _strip_mig(name: str) -> str:
    # "NVIDIA A100-SXM4-80GB MIG 1g.10gb" and "MIG 3g.40gb Device 0: ..." -> the parent card.
    return re.split(r"\s+MIG\b", name, maxsplit=1, flags=re.IGNORECASE)[0]


def _vgpu_parent(name: str) -> str | None:
    match = re.fullmatch(r"\s*(?:nvidia\s+)?grid\s+([a-z0-9]+)-[0-9a-z-]+\s*", name, re.IGNORECASE)
    return _VGPU_FAMILIES.get(match.group(1).lower()) if match else None


def lookup_gpu(name: str) -> GpuSpec | None:
    """The spec row for an NVML / nvidia-smi / torch device name, or None when unknown.

    Matching is tolerant of brand words ("NVIDIA", "Tesla", "GeForce"), case, dashes and word
    order, but never fuzzy: an unknown board gives None (use :func:`bandwidth_from_clock` and the
    live readings instead), never a neighbour's figures. MIG devices and vGPU profiles map to
    the physical card they run on.
    """
    if not isinstance(name, str) or not name.strip():
        return None
    _, index = _load()
    spec = index.get(_normalize(_strip_mig(name)))
    if spec is not None:
        return spec
    parent = _vgpu_parent(name)
    if parent is not None:
        return next((s for s in all_gpus() if s.key == parent), None)
    return None


# ROCm names some Instinct GCDs generically (the MI250 trace in the fixtures: "AMD Radeon
# Graphics", 104 CUs, 64 GB): such a device is told by its compute units and memory.
_GENERIC_AMD_NAMES = frozenset({"", "amd radeon graphics"})


def lookup_device(
    name: str, *, sm_count: int | None = None, memory_bytes: int | None = None
) -> GpuSpec | None:
    """The spec row for a device as a trace's ``deviceProperties`` or torch name it, NVIDIA
    or AMD Instinct; None when unknown.

    NVIDIA names go through :func:`lookup_gpu`; AMD Instinct names through the AMD rows. A
    device with ROCm's generic name is matched by its compute units (``sm_count``) and memory
    (within 5 % of the nominal size): when several rows match, they must agree on every
    figure a roofline reads (peaks, bandwidth, memory), and the row returned names them all
    (an MI210 and one GCD of an MI250 are the same silicon at the same clocks); otherwise None.
    """
    spec = lookup_gpu(name)
    if spec is not None or not isinstance(name, str):
        return spec
    spec = _amd_index().get(_normalize(name))
    if spec is not None:
        return spec
    if name.strip().lower() not in _GENERIC_AMD_NAMES or not sm_count or not memory_bytes:
        return None
    found = [
        s
        for s in all_gpus()
        if s.vendor == "amd"
        and s.sm_count == sm_count
        and abs(memory_bytes - s.memory_bytes) <= 0.05 * s.memory_bytes
    ]
    if not found:
        return None
    first = found[0]
    if len(found) == 1:
        return first
    same = all(
        s.memory_bandwidth_gbps == first.memory_bandwidth_gbps
        and s.memory_bytes == first.memory_bytes
        and s.peak_tflops.keys() == first.peak_tflops.keys()
        and all(abs(v - first.peak_tflops[k]) <= 0.005 * v for k, v in s.peak_tflops.items())
        for s in found
    )
    if not same:
        return None
    names = " or ".join(s.name.removeprefix("AMD Instinct ") for s in found)
    return replace(
        first,
        key="|".join(s.key for s in found),
        name=f"AMD Instinct {names}",
        source="; ".join(s.source for s in found),
        notes=f"ROCm named this device {name!r}: its {sm_count} compute units and memory match "
        f"{names}, whose figures agree (within 0.5 %, the rounding of the published figures); "
        f"those of {first.name} are used.",
        aliases=(),
    )


# --- figures from live readings ----------------------------------------------------------

# NVML's memory clock (nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM), nvidia-smi "max_clocks/
# mem_clock") is half the per-pin data rate in Mb/s for every memory type below. Checked on the
# recorded nvidia-smi dumps against the datasheets: GDDR5 P2000 3504 MHz x2 x160 bit = 140 GB/s;
# GDDR6 T4 5001 MHz x2 x256 bit = 320 GB/s; GDDR6X RTX 3090 9751 MHz x2 x384 bit = 936 GB/s;
# GDDR7 RTX PRO 6000 14001 MHz x2 x512 bit = 1792 GB/s; HBM2e A100 80GB 1593 MHz x2 x5120 bit
# = 2039 GB/s.
_DATA_RATE_PER_MEMORY_CLOCK: Mapping[str, int] = MappingProxyType(
    {
        "gddr5": 2,
        "gddr5x": 2,
        "gddr6": 2,
        "gddr6x": 2,
        "gddr7": 2,
        "hbm2": 2,
        "hbm2e": 2,
        "hbm3": 2,
        "hbm3e": 2,
    }
)


def bandwidth_from_clock(
    memory_clock_mhz: float, bus_width_bits: int, memory_type: str | None = None
) -> float:
    """Peak memory bandwidth in GB/s (1e9 B/s) from NVML's max memory clock and bus width.

    ``memory_clock_mhz x 2 x bus_width_bits / 8 / 1000``: NVML reports half the per-pin data
    rate, whatever the memory type (see the table above for the recorded cases). Use it for a
    card the spec table does not know.
    """
    if memory_type is not None and memory_type.lower() not in _DATA_RATE_PER_MEMORY_CLOCK:
        known = ", ".join(sorted(_DATA_RATE_PER_MEMORY_CLOCK))
        raise SpecsError(f"unknown memory type {memory_type!r}; known: {known} (or None).")
    if not (memory_clock_mhz > 0 and bus_width_bits > 0):
        raise SpecsError(
            f"memory clock ({memory_clock_mhz!r} MHz) and bus width ({bus_width_bits!r} bit) must "
            "be positive; NVML reports 0 for virtual GPUs, which have no bandwidth figure."
        )
    factor = _DATA_RATE_PER_MEMORY_CLOCK[(memory_type or "gddr6").lower()]
    return float(memory_clock_mhz) * factor * bus_width_bits / 8 / 1000


def derive_gpu_spec(
    name: str,
    *,
    compute_capability: object,
    sm_count: int,
    memory_bytes: int,
    max_memory_clock_mhz: float,
    memory_bus_width_bits: int,
    max_sm_clock_mhz: float | None = None,
    pcie_gen: int | None = None,
    power_limit_w: float | None = None,
) -> GpuSpec:
    """A stand-in :class:`GpuSpec` for a card the table does not know, built from NVML readings.

    Bandwidth comes from :func:`bandwidth_from_clock`; fp32 from SMs x FP32 lanes per SM x 2
    (FMA) x max SM clock when the clock is known. Tensor peaks are left out: they depend on
    the product (GeForce halves fp32-accumulate rates), so no honest estimate exists.
    """
    from gpudiag.specs._cc import architecture_name, cc_limits

    cc = parse_compute_capability(compute_capability)
    peaks: dict[str, float] = {}
    how = [f"bandwidth = {max_memory_clock_mhz:g} MHz x 2 x {memory_bus_width_bits} bit / 8"]
    if max_sm_clock_mhz:
        lanes = cc_limits(cc).fp32_lanes_per_sm
        peaks["fp32"] = sm_count * lanes * 2 * float(max_sm_clock_mhz) / 1e6
        how.append(f"fp32 = {sm_count} SMs x {lanes} lanes x 2 x {max_sm_clock_mhz:g} MHz")
    return GpuSpec(
        key="derived",
        name=name,
        architecture=architecture_name(cc),
        compute_capability=cc,
        sm_count=sm_count,
        memory_bytes=memory_bytes,
        memory_bandwidth_gbps=bandwidth_from_clock(max_memory_clock_mhz, memory_bus_width_bits),
        memory_bus_width_bits=memory_bus_width_bits,
        peak_tflops=MappingProxyType(peaks),
        nvlink_bandwidth_gbps=None,
        pcie_gen=pcie_gen,
        tdp_w=power_limit_w,
        source="derived from NVML readings (not a datasheet): " + "; ".join(how),
        notes="Not in the spec table; tensor-core peaks unknown.",
        derived=True,
    )
