"""Theoretical occupancy of a CUDA kernel launch, computed by NVIDIA's occupancy rules.

The rules are those of NVIDIA's occupancy calculator (``cuda_occupancy.h``, CUDA 12.9/13.0,
the same logic as ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``), re-expressed here from
its documented behaviour; the per-SM limits come from :func:`gpudiag.specs.cc_limits`:

* warps: a block takes ``ceil(threads / 32)`` warp slots; an SM has ``max_warps_per_sm``.
* registers: a warp's registers are rounded up to the 256-register allocation unit (so registers
  per thread effectively round up to a multiple of 8); the register file is split over 4
  sub-partitions and a warp's registers must fit in one. A block fails to
  launch when its registers (with its warps rounded up to a multiple of 4, as the hardware
  checks) exceed 64 K.
* shared memory: the block's static + dynamic shared memory plus the 1 KiB the driver reserves
  per block (cc >= 8.0) is rounded up to the allocation unit (256 B before 8.0, 128 B from 8.0).
  The SM's shared memory is the chosen L1/shared carveout; when one block needs more than the
  carveout, the next carveout that fits it is used instead.
* blocks: at most ``max_blocks_per_sm`` resident blocks.
* barriers (cc >= 9.0): the kernel's named barriers per block share ``max_barriers_per_sm``.

Policy for impossible kernels: values no kernel can have (0 threads, more than 255 registers per
thread, negative or over-48-KiB static shared memory, an unknown compute capability) raise
:class:`OccupancyInputError`. A kernel that is valid but cannot launch on this compute
capability (a block over 1024 threads, over 64 K registers, or more shared memory than the
opt-in maximum) gives an :class:`Occupancy` with 0 active blocks, the exhausted resource in
``limiting`` and a plain ``reason`` -- exactly as NVIDIA's calculator returns 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.errors import OccupancyInputError
from gpudiag.specs import SmLimits, SpecsError, cc_limits, parse_compute_capability

RESOURCES: tuple[str, ...] = ("warps", "registers", "shared_memory", "blocks", "barriers")
# Named barriers a block may use (bar.sync 0..15).
MAX_BARRIERS_PER_BLOCK = 16


@dataclass(frozen=True, slots=True)
class Occupancy(Carded):
    """How many blocks and warps of one launch configuration fit on one SM.

    ``blocks_limit`` maps each resource of :data:`RESOURCES` to the number of blocks that
    resource alone allows, or None when it sets no limit (a kernel without registers, without
    shared memory before cc 8.0, barriers before cc 9.0). ``limiting`` lists every resource
    whose own limit equals ``active_blocks_per_sm``. ``shared_memory_config_bytes`` is the
    SM's L1/shared split the calculation used; ``min_shared_memory_config_bytes`` the smallest
    split that still gives the same number of blocks (the rest of the unified cache stays L1).
    """

    cc: tuple[int, int]
    threads_per_block: int
    regs_per_thread: int
    smem_per_block_bytes: int
    dynamic_smem_per_block_bytes: int
    active_blocks_per_sm: int
    active_warps_per_sm: int
    max_warps_per_sm: int
    occupancy: float
    limiting: tuple[str, ...]
    blocks_limit: Mapping[str, int | None]
    shared_memory_config_bytes: int | None
    min_shared_memory_config_bytes: int | None
    warps_per_block: int
    allocated_registers_per_block: int
    allocated_smem_per_block_bytes: int
    barriers_per_block: int = 1
    carveout: str = "default"
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def active_threads_per_sm(self) -> int:
        return self.active_blocks_per_sm * self.threads_per_block

    @property
    def occupancy_pct(self) -> float:
        return 100.0 * self.occupancy

    @property
    def can_launch(self) -> bool:
        return self.active_blocks_per_sm > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "cc": f"{self.cc[0]}.{self.cc[1]}",
            "threads_per_block": self.threads_per_block,
            "regs_per_thread": self.regs_per_thread,
            "smem_per_block_bytes": self.smem_per_block_bytes,
            "dynamic_smem_per_block_bytes": self.dynamic_smem_per_block_bytes,
            "barriers_per_block": self.barriers_per_block,
            "carveout": self.carveout,
            "active_blocks_per_sm": self.active_blocks_per_sm,
            "active_warps_per_sm": self.active_warps_per_sm,
            "active_threads_per_sm": self.active_threads_per_sm,
            "max_warps_per_sm": self.max_warps_per_sm,
            "occupancy": self.occupancy,
            "limiting": list(self.limiting),
            "blocks_limit": dict(self.blocks_limit),
            "shared_memory_config_bytes": self.shared_memory_config_bytes,
            "min_shared_memory_config_bytes": self.min_shared_memory_config_bytes,
            "warps_per_block": self.warps_per_block,
            "allocated_registers_per_block": self.allocated_registers_per_block,
            "allocated_smem_per_block_bytes": self.allocated_smem_per_block_bytes,
            "reason": self.reason,
            "notes": list(self.notes),
        }

    def _summary(self) -> str:
        if not self.can_launch:
            return f"cannot launch: {self.reason}"
        return (
            f"{self.occupancy_pct:.1f}% occupancy: {self.active_blocks_per_sm} blocks x "
            f"{self.warps_per_block} warps = {self.active_warps_per_sm}/{self.max_warps_per_sm} "
            f"warps per SM, limited by {', '.join(self.limiting)}"
        )

    def __repr__(self) -> str:
        smem = self.smem_per_block_bytes + self.dynamic_smem_per_block_bytes
        limits = ", ".join(f"{k}={_fmt_limit(v)}" for k, v in self.blocks_limit.items())
        return (
            f"Occupancy(cc {self.cc[0]}.{self.cc[1]}, {self.threads_per_block} threads, "
            f"{self.regs_per_thread} regs, {smem} B smem: {self._summary()}; "
            f"blocks per resource: {limits})"
        )

    def as_card(self) -> Card:
        smem = self.smem_per_block_bytes + self.dynamic_smem_per_block_bytes
        inputs = Facts(
            [
                ("compute capability", f"{self.cc[0]}.{self.cc[1]}"),
                ("threads per block", self.threads_per_block),
                ("registers per thread", self.regs_per_thread),
                (
                    "shared memory per block",
                    f"{smem} B (allocated {self.allocated_smem_per_block_bytes} B)",
                ),
                ("carveout", self.carveout),
            ],
            caption="launch",
        )
        limits = Grid(
            ["resource", "blocks it allows", "limiting"],
            [
                (k, _fmt_limit(v), "yes" if k in self.limiting else "")
                for k, v in self.blocks_limit.items()
            ],
        )
        config = self.shared_memory_config_bytes
        extra = [
            ("active warps per SM", f"{self.active_warps_per_sm} / {self.max_warps_per_sm}"),
            ("shared memory config", "n/a" if config is None else f"{config // 1024} KiB"),
        ]
        return Card(
            f"Occupancy {self.occupancy_pct:.1f}%",
            [inputs, limits, Facts(extra), Lines(self.notes, "note")],
            subtitle=self._summary(),
        )


def _fmt_limit(value: int | None) -> str:
    return "no limit" if value is None else str(value)


# --- inputs ------------------------------------------------------------------------------


def _int(name: str, value: object, lo: int, hi: int | None, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise OccupancyInputError(f"{name} must be a whole number, got {value!r}.")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise OccupancyInputError(f"{name} must be {bound}, got {value}. {hint}".rstrip())
    return value


def _limits(cc: object) -> SmLimits:
    try:
        return cc_limits(parse_compute_capability(cc))
    except SpecsError as exc:
        raise OccupancyInputError(str(exc)) from exc


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _carveout_config(limits: SmLimits, size_bytes: int) -> int | None:
    """The smallest shared-memory configuration that holds ``size_bytes`` (None: none does)."""
    return next((c for c in limits.shared_memory_carveouts_bytes if c >= size_bytes), None)


def _preferred_config(
    limits: SmLimits, carveout_kib: int | None, carveout_percent: int | None
) -> tuple[int, str]:
    if carveout_kib is not None and carveout_percent is not None:
        raise OccupancyInputError("give carveout_kib or carveout_percent, not both.")
    if carveout_percent is not None:
        pct = _int(
            "carveout_percent",
            carveout_percent,
            -1,
            100,
            "It is cudaFuncAttributePreferredSharedMemoryCarveout: -1 (default) or 0..100.",
        )
        if pct >= 0:
            # The preference is a share of the SM's maximum, rounded up to a real configuration.
            wanted = pct * limits.shared_memory_per_sm_bytes // 100
            config = _carveout_config(limits, wanted)
            assert config is not None  # a share of the maximum always fits
            return config, f"{pct}% ({config // 1024} KiB)"
    if carveout_kib is not None:
        kib = _int("carveout_kib", carveout_kib, 0, None, "")
        config = _carveout_config(limits, kib * 1024)
        if config is None:
            valid = ", ".join(str(k) for k in limits.shared_memory_carveouts_kib)
            cc = limits.compute_capability
            raise OccupancyInputError(
                f"carveout {kib} KiB is more than an SM of compute capability {cc[0]}.{cc[1]} "
                f"has; valid shared-memory configurations are {valid} KiB."
            )
        return config, f"{config // 1024} KiB"
    return limits.shared_memory_per_sm_bytes, "default (maximum shared memory)"


def carveout_config_bytes(
    cc: object, *, carveout_kib: int | None = None, carveout_percent: int | None = None
) -> int:
    """The SM shared-memory configuration a carveout request rounds up to (bytes); with no
    request, the maximum (what the calculator assumes by default)."""
    return _preferred_config(_limits(cc), carveout_kib, carveout_percent)[0]


# --- the calculation ---------------------------------------------------------------------


def occupancy(
    cc: object,
    threads_per_block: int,
    regs_per_thread: int,
    smem_per_block: int = 0,
    *,
    dynamic_smem_per_block: int = 0,
    carveout_kib: int | None = None,
    carveout_percent: int | None = None,
    barriers_per_block: int = 1,
) -> Occupancy:
    """Theoretical occupancy of a launch, as NVIDIA's occupancy calculator computes it.

    ``smem_per_block`` is the kernel's static shared memory (at most 48 KiB, a compiler limit),
    ``dynamic_smem_per_block`` the launch's dynamic shared memory; the kernel is taken to have
    opted in (``cudaFuncAttributeMaxDynamicSharedMemorySize``) to the dynamic size it launches
    with. ``carveout_kib`` picks an L1/shared split (rounded up to a valid one) and
    ``carveout_percent`` is the CUDA attribute ``PreferredSharedMemoryCarveout``; with neither,
    the calculation assumes the maximum shared memory, as the CUDA runtime's calculator does.
    ``barriers_per_block`` is the number of named barriers (``__syncthreads`` uses one).
    """
    limits = _limits(cc)
    threads = _int(
        "threads_per_block", threads_per_block, 1, None, "A block needs at least one thread."
    )
    regs = _int(
        "regs_per_thread",
        regs_per_thread,
        0,
        limits.max_registers_per_thread,
        "ptxas never gives a thread more than 255 registers (see --resource-usage).",
    )
    static_smem = _int(
        "smem_per_block",
        smem_per_block,
        0,
        limits.max_shared_memory_per_block_bytes,
        "Static shared memory is capped at 48 KiB; larger buffers must be dynamic "
        "(pass dynamic_smem_per_block).",
    )
    dynamic_smem = _int("dynamic_smem_per_block", dynamic_smem_per_block, 0, None, "")
    barriers = _int(
        "barriers_per_block",
        barriers_per_block,
        0,
        MAX_BARRIERS_PER_BLOCK,
        "A block has 16 named barriers.",
    )
    cc_key = limits.compute_capability
    cc_text = f"{cc_key[0]}.{cc_key[1]}"
    warp = limits.warp_size
    warps_per_block = math.ceil(threads / warp)
    reasons: list[str] = []

    # Warps.
    if threads > limits.max_threads_per_block:
        by_warps = 0
        reasons.append(
            f"a block of {threads} threads exceeds the {limits.max_threads_per_block}-thread "
            "limit per block"
        )
    else:
        by_warps = limits.max_warps_per_sm // warps_per_block

    # Registers: allocated per warp in units of 256, each warp inside one of 4 sub-partitions.
    regs_per_warp = _round_up(regs * warp, limits.register_allocation_unit)
    regs_per_block = regs_per_warp * warps_per_block
    subs = limits.register_sub_partitions
    regs_checked = regs_per_warp * _round_up(warps_per_block, subs)
    by_regs: int | None
    if max(regs_per_block, regs_checked) > limits.max_registers_per_block:
        by_regs = 0
        reasons.append(
            f"{regs} registers x {warps_per_block} warps needs {regs_checked} registers per block "
            f"as the hardware counts them (warps rounded up to a multiple of {subs}); a block may "
            f"use at most {limits.max_registers_per_block}"
        )
    elif regs_per_warp == 0:
        by_regs = None
    else:
        warps_per_sub = (limits.registers_per_sm // subs) // regs_per_warp
        by_regs = warps_per_sub * subs // warps_per_block

    # Shared memory.
    reserved = limits.reserved_shared_memory_per_block_bytes
    requested = static_smem + dynamic_smem + reserved
    allocated_smem = _round_up(requested, limits.shared_memory_allocation_unit_bytes)
    optin = requested > limits.max_shared_memory_per_block_bytes
    per_block_max = (
        limits.max_shared_memory_per_block_optin_bytes
        if optin
        else limits.max_shared_memory_per_block_bytes
    ) + reserved
    preferred, carveout_label = _preferred_config(limits, carveout_kib, carveout_percent)
    by_smem: int | None
    config: int | None
    if allocated_smem > per_block_max:
        by_smem, config = 0, None
        reasons.append(
            f"{allocated_smem} B of shared memory per block (static {static_smem} + dynamic "
            f"{dynamic_smem} + {reserved} reserved, rounded to "
            f"{limits.shared_memory_allocation_unit_bytes} B) exceeds the "
            f"{per_block_max} B a block may use on cc {cc_text}"
        )
    else:
        if preferred >= allocated_smem:
            config = preferred
        else:
            # One block needs more than the preferred split: the driver takes the split that fits.
            config = _carveout_config(limits, allocated_smem)
        assert config is not None
        by_smem = config // allocated_smem if allocated_smem > 0 else None

    by_blocks = limits.max_blocks_per_sm
    by_barriers: int | None = None
    if limits.barrier_limit_applies and barriers > 0:
        by_barriers = limits.max_barriers_per_sm // barriers

    blocks_limit = {
        "warps": by_warps,
        "registers": by_regs,
        "shared_memory": by_smem,
        "blocks": by_blocks,
        "barriers": by_barriers,
    }
    active = min(v for v in blocks_limit.values() if v is not None)
    limiting = tuple(k for k, v in blocks_limit.items() if v == active)
    if active == 0 and not reasons:  # only barriers can get here without a reason
        reasons.append(f"{barriers} barriers per block exceed the SM's barrier slots")

    min_config: int | None = None
    if active > 0 and config is not None:
        need = active * allocated_smem
        min_config = _carveout_config(limits, need)

    notes: list[str] = []
    if by_barriers is not None and by_barriers == active and active < by_blocks:
        notes.append(
            f"named barriers limit this kernel: {barriers} per block of "
            f"{limits.max_barriers_per_sm} per SM"
        )
    if preferred < allocated_smem and by_smem:
        notes.append(
            f"the requested carveout ({preferred // 1024} KiB) is smaller than one block's shared "
            f"memory; the {config // 1024 if config else 0} KiB configuration is used instead"
        )

    active_warps = active * warps_per_block
    return Occupancy(
        cc=cc_key,
        threads_per_block=threads,
        regs_per_thread=regs,
        smem_per_block_bytes=static_smem,
        dynamic_smem_per_block_bytes=dynamic_smem,
        active_blocks_per_sm=active,
        active_warps_per_sm=active_warps,
        max_warps_per_sm=limits.max_warps_per_sm,
        occupancy=active_warps / limits.max_warps_per_sm,
        limiting=limiting,
        blocks_limit=MappingProxyType(blocks_limit),
        shared_memory_config_bytes=config,
        min_shared_memory_config_bytes=min_config,
        warps_per_block=warps_per_block,
        allocated_registers_per_block=regs_per_block,
        allocated_smem_per_block_bytes=allocated_smem,
        barriers_per_block=barriers,
        carveout=carveout_label,
        reason="; ".join(reasons),
        notes=tuple(notes),
    )


def best_block_size(
    cc: object,
    regs_per_thread: int,
    smem_per_block: int = 0,
    *,
    dynamic_smem_per_block: int = 0,
    smem_per_thread: int = 0,
    block_size_limit: int | None = None,
    carveout_kib: int | None = None,
    carveout_percent: int | None = None,
    barriers_per_block: int = 1,
) -> tuple[int, Occupancy]:
    """The block size with the highest occupancy, as ``cudaOccupancyMaxPotentialBlockSize``.

    Block sizes are tried from the largest (``min(1024, block_size_limit)``) down in steps of a
    warp; the first size reaching the highest number of resident threads wins, so ties go to
    the LARGER block. ``smem_per_thread`` adds ``smem_per_thread x block size`` bytes of dynamic
    shared memory (the ``blockSizeToDynamicSMemSize`` callback of the CUDA API).
    """
    limits = _limits(cc)
    per_thread = _int("smem_per_thread", smem_per_thread, 0, None, "")
    ceiling = limits.max_threads_per_block
    if block_size_limit is not None:
        ceiling = min(ceiling, _int("block_size_limit", block_size_limit, 1, None, ""))
    best: Occupancy | None = None
    best_threads = 0
    size_aligned = _round_up(ceiling, limits.warp_size)
    while size_aligned > 0:
        size = min(ceiling, size_aligned)
        occ = occupancy(
            limits.compute_capability,
            size,
            regs_per_thread,
            smem_per_block,
            dynamic_smem_per_block=dynamic_smem_per_block + per_thread * size,
            carveout_kib=carveout_kib,
            carveout_percent=carveout_percent,
            barriers_per_block=barriers_per_block,
        )
        if occ.active_threads_per_sm > best_threads:
            best, best_threads = occ, occ.active_threads_per_sm
        if best_threads == limits.max_threads_per_sm:
            break
        size_aligned -= limits.warp_size
    if best is None:
        smallest = occupancy(
            limits.compute_capability,
            min(ceiling, limits.warp_size),
            regs_per_thread,
            smem_per_block,
            dynamic_smem_per_block=dynamic_smem_per_block
            + per_thread * min(ceiling, limits.warp_size),
            carveout_kib=carveout_kib,
            carveout_percent=carveout_percent,
            barriers_per_block=barriers_per_block,
        )
        raise OccupancyInputError(
            f"no block size lets this kernel launch on cc {limits.compute_capability[0]}."
            f"{limits.compute_capability[1]}: {smallest.reason}."
        )
    return best.threads_per_block, best


def block_size_advice(
    current: Occupancy,
    best: Occupancy | None,
    *,
    carveout_kib: int | None = None,
    carveout_percent: int | None = None,
    barriers_per_block: int = 1,
) -> list[str]:
    """What to change about a launch, in sentences: a block size that really gains occupancy,
    or, when none does (a tie goes to the launch as it is, never to a bigger block that gains
    nothing), the register or shared-memory budget that would lift it."""
    if best is None:
        return ["no block size lets this kernel launch"]
    if not current.can_launch:
        return [
            f"best block size: {best.threads_per_block} threads ({best.occupancy_pct:.1f}%, "
            f"{best.active_blocks_per_sm} blocks/SM); {current.threads_per_block} cannot launch"
        ]
    if best.active_threads_per_sm > current.active_threads_per_sm:
        return [
            f"best block size: {best.threads_per_block} threads ({best.occupancy_pct:.1f}%, "
            f"up from {current.occupancy_pct:.1f}% at {current.threads_per_block})"
        ]
    lines = [
        f"{current.threads_per_block} threads already gives the highest occupancy of any "
        f"block size ({current.occupancy_pct:.1f}%)"
    ]
    if current.active_warps_per_sm >= current.max_warps_per_sm:
        return lines
    common: dict[str, Any] = {
        "carveout_kib": carveout_kib,
        "carveout_percent": carveout_percent,
        "barriers_per_block": barriers_per_block,
    }

    def at(regs: int, static: int, dynamic: int) -> Occupancy:
        return occupancy(
            current.cc,
            current.threads_per_block,
            regs,
            static,
            dynamic_smem_per_block=dynamic,
            **common,
        )

    static, dynamic = current.smem_per_block_bytes, current.dynamic_smem_per_block_bytes
    if "registers" in current.limiting:
        for regs in range(current.regs_per_thread - 1, 0, -1):
            occ = at(regs, static, dynamic)
            if occ.active_warps_per_sm > current.active_warps_per_sm:
                lines.append(
                    f"fewer registers lift it: at most {regs} registers/thread gives "
                    f"{occ.occupancy_pct:.1f}% (__launch_bounds__ or -maxrregcount)"
                )
                break
    if "shared_memory" in current.limiting and static + dynamic > 0:
        total = static + dynamic
        for smem in range((total - 1) // 256 * 256, -1, -256):
            cut = total - smem
            occ = at(
                current.regs_per_thread,
                max(0, static - max(0, cut - dynamic)),
                max(0, dynamic - cut),
            )
            if occ.active_warps_per_sm > current.active_warps_per_sm:
                lines.append(
                    f"less shared memory lifts it: at most {smem} B/block gives "
                    f"{occ.occupancy_pct:.1f}%"
                )
                break
    if len(lines) == 1:
        lines.append(f"limited by {', '.join(current.limiting)}")
    return lines


def occupancy_curve(
    cc: object,
    regs_per_thread: int,
    smem_per_block: int = 0,
    *,
    dynamic_smem_per_block: int = 0,
    smem_per_thread: int = 0,
    carveout_kib: int | None = None,
    carveout_percent: int | None = None,
    barriers_per_block: int = 1,
) -> list[Occupancy]:
    """Occupancy at every block size from one warp to the maximum, in steps of a warp."""
    limits = _limits(cc)
    per_thread = _int("smem_per_thread", smem_per_thread, 0, None, "")
    return [
        occupancy(
            limits.compute_capability,
            size,
            regs_per_thread,
            smem_per_block,
            dynamic_smem_per_block=dynamic_smem_per_block + per_thread * size,
            carveout_kib=carveout_kib,
            carveout_percent=carveout_percent,
            barriers_per_block=barriers_per_block,
        )
        for size in range(limits.warp_size, limits.max_threads_per_block + 1, limits.warp_size)
    ]
