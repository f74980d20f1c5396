"""Per compute capability: SM limits (for the occupancy calculator) and feature flags."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from gpudiag._report import card, html_table, jsonable
from gpudiag.errors import SpecsError, UnknownComputeCapabilityError

ComputeCapability = tuple[int, int]

_ARCHITECTURES: dict[int, str] = {
    6: "Pascal",
    7: "Volta",  # 7.5 is Turing, handled below
    8: "Ampere",  # 8.9 is Ada, handled below
    9: "Hopper",
    10: "Blackwell",
    11: "Blackwell",
    12: "Blackwell",
}


def parse_compute_capability(cc: object) -> ComputeCapability:
    """``(8, 0)``, ``"8.0"``, ``"sm_80"``, ``"80"`` or ``8.0`` -> ``(8, 0)``.

    A float is read through its shortest text form, so ``8.9`` is (8, 9) and ``12.0`` is (12, 0).
    """
    if isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(v, int) for v in cc):
        return (int(cc[0]), int(cc[1]))
    if isinstance(cc, list) and len(cc) == 2 and all(isinstance(v, int) for v in cc):
        return (int(cc[0]), int(cc[1]))
    if isinstance(cc, float):
        cc = repr(cc)
    if isinstance(cc, str):
        text = cc.strip().lower()
        text = re.sub(r"^(sm|compute)_?", "", text)
        text = re.sub(r"[af]$", "", text)  # sm_90a, sm_100f: arch-specific suffixes
        match = re.fullmatch(r"([0-9]+)\.([0-9])", text)
        if match:
            return (int(match.group(1)), int(match.group(2)))
        if re.fullmatch(r"[0-9]{2,3}", text):
            return (int(text[:-1]), int(text[-1]))
    raise SpecsError(
        f"cannot read {cc!r} as a compute capability: give it as (8, 0), '8.0' or 'sm_80'."
    )


def architecture_name(cc: object) -> str:
    """'Volta', 'Turing', 'Ampere', 'Ada', 'Hopper' or 'Blackwell' (and 'Pascal' for 6.x)."""
    major, minor = parse_compute_capability(cc)
    if (major, minor) == (7, 5):
        return "Turing"
    if (major, minor) == (8, 9):
        return "Ada"
    try:
        return _ARCHITECTURES[major]
    except KeyError:
        raise UnknownComputeCapabilityError(
            f"compute capability {major}.{minor} is not an NVIDIA architecture gpudiag knows "
            f"(known majors: {', '.join(str(m) for m in sorted(_ARCHITECTURES))})."
        ) from None


@dataclass(frozen=True, slots=True)
class SmLimits:
    """What one SM of a compute capability can hold: the inputs of the occupancy calculator.

    Sources: the CUDA C++ Programming Guide's compute-capability tables and NVIDIA's
    ``cuda_occupancy.h`` (allocation units, carveout sizes, barrier slots); see
    ``compute_capabilities.json``.
    """

    compute_capability: ComputeCapability
    architecture: str
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_block: int
    max_registers_per_thread: int
    register_allocation_unit: int  # registers, per warp
    register_allocation_granularity: str  # 'warp'
    register_sub_partitions: int  # registers are split across this many warp schedulers
    warp_size: int
    max_threads_per_block: int
    shared_memory_per_sm_bytes: int
    max_shared_memory_per_block_bytes: int  # without opting in (48 KiB)
    max_shared_memory_per_block_optin_bytes: int
    reserved_shared_memory_per_block_bytes: int
    shared_memory_allocation_unit_bytes: int
    shared_memory_carveouts_kib: tuple[int, ...]
    max_barriers_per_sm: int
    barrier_limit_applies: bool  # cuda_occupancy.h applies the barrier limit from cc 9.0 on
    fp32_lanes_per_sm: int
    examples: str = ""
    note: str = ""

    @property
    def shared_memory_carveouts_bytes(self) -> tuple[int, ...]:
        return tuple(k * 1024 for k in self.shared_memory_carveouts_kib)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}
        out["compute_capability"] = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        return out

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        return (
            f"SmLimits(cc={major}.{minor} {self.architecture}: {self.max_warps_per_sm} warps, "
            f"{self.max_blocks_per_sm} blocks, {self.registers_per_sm} regs, "
            f"{self.shared_memory_per_sm_bytes // 1024} KiB smem/SM, "
            f"{self.max_shared_memory_per_block_optin_bytes // 1024} KiB/block opt-in)"
        )

    def _repr_html_(self) -> str:
        major, minor = self.compute_capability
        rows = [(k, v) for k, v in self.to_dict().items() if k not in {"examples", "note"}]
        return card(
            f"SM limits, compute capability {major}.{minor}",
            html_table(rows),
            subtitle=f"{self.architecture}: {self.examples}"
            if self.examples
            else self.architecture,
        )


@dataclass(frozen=True, slots=True)
class CcFeatures:
    """What a compute capability supports (tensor-core types, async copies, TMA, ...).

    Per-card exceptions exist: GTX 16xx (7.5) has no tensor cores. ``flash_attention_2`` and
    ``flash_attention_3`` say whether the upstream flash-attn kernels target this capability.
    """

    compute_capability: ComputeCapability
    architecture: str
    tensor_cores: bool
    fp16_tensor_cores: bool
    int8_tensor_cores: bool
    tf32: bool
    bf16: bool
    fp8: bool
    fp4: bool
    flash_attention_2: bool
    flash_attention_3: bool
    cuda_graphs: bool
    async_copy: bool
    tma: bool
    wgmma: bool
    thread_block_clusters: bool

    @property
    def fp16(self) -> bool:
        """Tensor-core fp16 (the name dtype-keyed callers use)."""
        return self.fp16_tensor_cores

    @property
    def int8(self) -> bool:
        return self.int8_tensor_cores

    def supports(self, dtype: str) -> bool:
        """Whether tensor cores of this capability take ``dtype`` ('fp32' is always True)."""
        if dtype in {"fp32", "fp64"}:
            return True
        flags = {
            "tf32": self.tf32,
            "bf16": self.bf16,
            "fp16": self.fp16_tensor_cores,
            "fp8": self.fp8,
            "fp4": self.fp4,
            "int8": self.int8_tensor_cores,
        }
        if dtype not in flags:
            raise SpecsError(f"unknown dtype {dtype!r}: use one of fp32, fp64, {', '.join(flags)}.")
        return flags[dtype]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}
        out["compute_capability"] = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        return out

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        on = [k for k, v in self.to_dict().items() if v is True]
        return f"CcFeatures(cc={major}.{minor} {self.architecture}: {', '.join(on) or 'none'})"

    def _repr_html_(self) -> str:
        major, minor = self.compute_capability
        rows = [(k, "yes" if v else "no") for k, v in self.to_dict().items() if isinstance(v, bool)]
        return card(
            f"Features, compute capability {major}.{minor}",
            html_table(rows),
            subtitle=self.architecture,
        )


@functools.cache
def _table() -> dict[ComputeCapability, dict[str, Any]]:
    text = resources.files("gpudiag.specs").joinpath("compute_capabilities.json").read_text("utf-8")
    rows = json.loads(text)["compute_capabilities"]
    return {parse_compute_capability(row["compute_capability"]): row for row in rows}


def known_compute_capabilities() -> tuple[ComputeCapability, ...]:
    """Every compute capability :func:`cc_limits` knows, in order."""
    return tuple(sorted(_table()))


@functools.cache
def _limits(cc: ComputeCapability) -> SmLimits:
    row = _table()[cc]
    kib = 1024
    return SmLimits(
        compute_capability=cc,
        architecture=row["architecture"],
        max_threads_per_sm=row["max_threads_per_sm"],
        max_warps_per_sm=row["max_threads_per_sm"] // row["warp_size"],
        max_blocks_per_sm=row["max_blocks_per_sm"],
        registers_per_sm=row["registers_per_sm"],
        max_registers_per_block=row["max_registers_per_block"],
        max_registers_per_thread=row["max_registers_per_thread"],
        register_allocation_unit=256,
        register_allocation_granularity="warp",
        register_sub_partitions=4,
        warp_size=row["warp_size"],
        max_threads_per_block=row["max_threads_per_block"],
        shared_memory_per_sm_bytes=row["shared_memory_per_sm_kib"] * kib,
        max_shared_memory_per_block_bytes=row["max_shared_memory_per_block_kib"] * kib,
        max_shared_memory_per_block_optin_bytes=row["max_shared_memory_per_block_optin_kib"] * kib,
        reserved_shared_memory_per_block_bytes=row["reserved_shared_memory_per_block_bytes"],
        shared_memory_allocation_unit_bytes=row["shared_memory_allocation_unit_bytes"],
        shared_memory_carveouts_kib=tuple(row["shared_memory_carveouts_kib"]),
        max_barriers_per_sm=row["max_blocks_per_sm"] * row["barriers_per_block_slot"],
        barrier_limit_applies=cc >= (9, 0),
        fp32_lanes_per_sm=row["fp32_lanes_per_sm"],
        examples=row.get("examples", ""),
        note=row.get("note", ""),
    )


def _unknown(cc: ComputeCapability) -> UnknownComputeCapabilityError:
    known = ", ".join(f"{a}.{b}" for a, b in known_compute_capabilities())
    hint = (
        " Pascal and older GPUs (cc < 7.0) are outside the calculator's range."
        if cc < (7, 0)
        else " A newer GPU than this gpudiag version knows: upgrade gpudiag."
    )
    return UnknownComputeCapabilityError(
        f"no SM limits for compute capability {cc[0]}.{cc[1]} (known: {known}).{hint}"
    )


def cc_limits(cc: object) -> SmLimits:
    """Per-SM limits of a compute capability (7.0 to 12.1); unknown ones raise
    :class:`UnknownComputeCapabilityError` rather than guessing from a neighbour."""
    key = parse_compute_capability(cc)
    if key not in _table():
        raise _unknown(key)
    return _limits(key)


def features(cc: object) -> CcFeatures:
    """Feature flags of a compute capability (any 6.x to 12.x; others raise)."""
    key = parse_compute_capability(cc)
    arch = architecture_name(key)
    return CcFeatures(
        compute_capability=key,
        architecture=arch,
        tensor_cores=key >= (7, 0),
        fp16_tensor_cores=key >= (7, 0),
        # Volta's first tensor cores (7.0) take fp16 only; Xavier (7.2) and Turing added int8.
        int8_tensor_cores=key >= (7, 2),
        tf32=key >= (8, 0),
        bf16=key >= (8, 0),
        fp8=key >= (8, 9),
        fp4=key >= (10, 0),
        flash_attention_2=key >= (8, 0),
        flash_attention_3=key == (9, 0),
        cuda_graphs=True,
        async_copy=key >= (8, 0),
        tma=key >= (9, 0),
        wgmma=key == (9, 0),  # sm_90a only; Blackwell uses tcgen05 instead
        thread_block_clusters=key >= (9, 0),
    )
