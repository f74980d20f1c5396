"""GPU kernels: category, tensor-core use by name, and the per-kernel table with occupancy."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag.analysis.trace.kernel_classes import (
    COMMUNICATION,
    COMPUTE,
    MEMORY,
    SYNC,
    classify_kernel,
    kernel_dtype,
)
from gpudiag.analysis.trace.kernel_names import readable_kernel_name
from gpudiag.analysis.trace.model import (
    F64,
    I64,
    DeviceProperties,
    Events,
    Kind,
    LaunchTable,
    dense_codes,
    fields_json,
)

CATEGORIES: tuple[str, ...] = (COMPUTE, COMMUNICATION, MEMORY, SYNC)
SHORT_KERNEL_US = 10.0

# ATen operators whose work tensor cores could do (matmul, linear, conv, bmm, attention).
_ELIGIBLE_OP = re.compile(
    r"^_?(?:mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_addmm_activation|_scaled_mm|"
    r"_int_mm|addmv)$|conv|attention|^_?cudnn_rnn|^lstm|^gru",
    re.IGNORECASE,
)


def kernel_category(kind: int, name: str) -> str:
    """compute / communication / memory / sync of a GPU event (kernels by their name, see
    ``gpudiag.analysis.trace.kernel_classes``)."""
    if kind == Kind.GPU_SYNC:
        return SYNC
    if kind in (Kind.MEMCPY, Kind.MEMSET):
        return MEMORY
    return classify_kernel(name).category


def uses_tensor_cores(name: str) -> bool:
    """Whether a kernel's name says it runs on tensor cores or AMD matrix cores (False when
    the name says it does not, or cannot tell: ``classify_kernel(name).tensor_cores`` is
    None then)."""
    return classify_kernel(name).tensor_cores is True


@functools.lru_cache(maxsize=4096)
def is_tensor_core_eligible_op(op_name: str) -> bool:
    """Whether an operator (``aten::addmm``, ``aten::cudnn_convolution``, ...) could use them."""
    return _ELIGIBLE_OP.search(op_name.rsplit("::", 1)[-1]) is not None


def short_name(name: str, width: int = 80) -> str:
    """A readable kernel name: no return type, argument list or C++ namespace noise, cut to
    ``width`` characters (see ``gpudiag.analysis.trace.kernel_names``)."""
    return readable_kernel_name(name, width)


@dataclass(frozen=True)
class KernelStats:
    """One kernel name's calls in the analysed window (times in microseconds).

    Launch configuration fields describe the configuration that took the most time.
    Occupancy and SM efficiency are duration-weighted over the calls that recorded a
    launch configuration; None when the trace has none (or no deviceProperties).
    ``achieved_occupancy`` is an estimate from the launch (the blocks that fit on the SMs
    given the grid), not a hardware counter: tools that read counters (Nsight Compute) can
    give a lower figure.
    """

    name: str
    category: str
    count: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    std_us: float
    share: float  # of all kernel time (compute + communication) in the window
    tensor_cores: bool
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    blocks_per_sm: float | None = None
    theoretical_occupancy: float | None = None
    achieved_occupancy: float | None = None
    sm_efficiency: float | None = None
    occupancy_limited_by: tuple[str, ...] = ()
    launched_by: str | None = None  # the operator that launched most of its time
    short_calls: int = 0  # calls under 10 us
    # What the name says (gpudiag.analysis.trace.kernel_classes): the family, the provider
    # (the library that ships the kernel: "cuBLAS", "hipBLASLt", ...), the vendor where the
    # name is vendor-specific, and whether ``tensor_cores`` is known
    # (False with tensor_cores_known=False: the name cannot tell, e.g. a Triton template).
    family: str | None = None
    provider: str | None = None
    vendor: str | None = None
    tensor_cores_known: bool = True
    # The dtype it ran in: the launching operator's recorded Input type where the trace has
    # it (dtype_source "op input type"), else what the name states ("kernel name").
    dtype: str | None = None
    dtype_source: str = "unknown"

    @property
    def short_name(self) -> str:
        return short_name(self.name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["short_name"] = self.short_name
        return out


@dataclass(frozen=True)
class EligibleOp:
    """A tensor-core-eligible operator and how much of its kernel time used tensor cores."""

    name: str
    count: int
    kernel_us: float
    tensor_core_us: float
    top_kernel: str
    unknown_us: float = 0.0  # calls whose kernels' names cannot tell

    @property
    def without_tensor_cores_us(self) -> float:
        return self.kernel_us - self.tensor_core_us - self.unknown_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["without_tensor_cores_us"] = self.without_tensor_cores_us
        return out


@dataclass(frozen=True)
class TensorCoreUse:
    """Tensor-core share of compute-kernel time, and eligible work that did not use them."""

    share: float | None  # tensor-core kernel time / compute kernel time
    tensor_core_us: float
    compute_us: float
    eligible_without_tensor_cores_us: float | None  # None: kernels could not be tied to ops
    eligible_ops: tuple[EligibleOp, ...] = ()
    linked_share: float = 0.0  # of compute kernel time tied to the operator that launched it
    # Compute kernel time whose names cannot tell whether tensor cores ran (Triton
    # templates, unknown kernels): counted in neither tensor_core_us nor "without".
    unknown_us: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True, eq=False)
class KernelColumns:
    """Per-row facts about the GPU rows of the window, aligned with ``rows``."""

    rows: I64
    category: np.ndarray  # str per row (object array)
    tensor_cores: np.ndarray  # bool per row
    theoretical: F64  # NaN where unknown
    achieved: F64
    sm_efficiency: F64
    blocks_per_sm: F64
    limited_by: list[tuple[str, ...]] = field(default_factory=list)
    tensor_cores_unknown: np.ndarray | None = None  # bool per row: the name cannot tell


def _device_for(devices: Sequence[DeviceProperties], device: int) -> DeviceProperties | None:
    for d in devices:
        if d.id == device:
            return d
    return devices[0] if devices else None


def launch_columns(
    events: Events, rows: I64, devices: Sequence[DeviceProperties], categories: np.ndarray
) -> KernelColumns:
    """Tensor-core flag, occupancy and SM efficiency for each GPU row (``categories``: from
    ``kernel_category``, aligned with ``rows``)."""
    names = events.names
    name_ids = events.name[rows]
    kinds = events.kind[rows]
    tensor = np.zeros(rows.size, dtype=bool)
    unknown = np.zeros(rows.size, dtype=bool)
    kernel_idx = np.flatnonzero(kinds == Kind.KERNEL)
    if kernel_idx.size:
        uniq, inv = np.unique(name_ids[kernel_idx], return_inverse=True)
        said = [classify_kernel(names[int(n)]).tensor_cores for n in uniq.tolist()]
        tensor[kernel_idx] = np.array([t is True for t in said], dtype=bool)[inv]
        unknown[kernel_idx] = np.array([t is None for t in said], dtype=bool)[inv]
    theo, achieved, sm_eff, per_sm, limited = _occupancy(events, rows, devices)
    return KernelColumns(rows, categories, tensor, theo, achieved, sm_eff, per_sm, limited, unknown)


def _occupancy(
    events: Events, rows: I64, devices: Sequence[DeviceProperties]
) -> tuple[F64, F64, F64, F64, list[tuple[str, ...]]]:
    n = rows.size
    theo = np.full(n, np.nan)
    achieved = np.full(n, np.nan)
    sm_eff = np.full(n, np.nan)
    per_sm = np.full(n, np.nan)
    limited: list[tuple[str, ...]] = [()] * n
    extra = events.extra[rows]
    lt = events.launches
    idx = np.flatnonzero((events.kind[rows] == Kind.KERNEL) & (extra >= 0))
    if idx.size == 0 or not devices:
        return theo, achieved, sm_eff, per_sm, limited
    x = extra[idx]
    blocks, threads = lt.blocks[x], lt.threads_per_block[x]
    regs, smem = lt.registers_per_thread[x], lt.shared_memory_bytes[x]
    dev_ids: np.ndarray = events.device[rows][idx]
    ok = (blocks > 0) & (threads > 0)
    idx, blocks, threads, regs, smem, dev_ids = (
        a[ok] for a in (idx, blocks, threads, regs, smem, dev_ids)
    )
    dev_of = {int(d): _device_for(devices, int(d)) for d in np.unique(dev_ids).tolist()}
    sms_of = {d: (p.num_sms or 0) if p is not None else 0 for d, p in dev_of.items()}
    sms = np.array([sms_of[d] for d in dev_ids.tolist()])
    has_sms = sms > 0
    bps = np.where(has_sms, blocks / np.maximum(sms, 1), np.nan)
    per_sm[idx] = bps
    sm_eff[idx] = np.minimum(bps, 1.0)
    try:  # the calculator lives in its own module; an unknown card just leaves N/A
        from gpudiag.analysis.occupancy import occupancy
    except ImportError:  # pragma: no cover - shipped together
        return theo, achieved, sm_eff, per_sm, limited
    # One calculator call per distinct (device, block size, registers, shared memory).
    numbered = _numbered((dev_ids, threads, regs, smem))
    configs: dict[tuple[int, int, int, int], int] = {
        (int(dev_ids[i]), int(threads[i]), int(regs[i]), int(smem[i])): c
        for c, i in enumerate(numbered.first.tolist())
    }
    inv = numbered.number
    c_theo = np.full(len(configs), np.nan)
    c_active = np.full(len(configs), np.nan)
    c_max_warps = np.full(len(configs), np.nan)
    c_warps_per_block = np.full(len(configs), np.nan)
    c_limit: list[tuple[str, ...]] = [()] * len(configs)
    for (dev_id, t, r, sm), c in configs.items():
        dev = dev_of[dev_id]
        if dev is None or dev.compute_capability is None or r < 0 or sm < 0:
            continue
        occ = _theoretical(occupancy, dev.compute_capability, t, r, sm)
        if occ is None:
            continue
        c_theo[c] = occ.occupancy
        c_limit[c] = tuple(occ.limiting)
        if occ.active_blocks_per_sm > 0 and occ.max_warps_per_sm > 0:
            c_active[c] = occ.active_blocks_per_sm
            c_max_warps[c] = occ.max_warps_per_sm
            c_warps_per_block[c] = -(-t // (dev.warp_size or 32))
    theo[idx] = c_theo[inv]
    # Blocks resident per SM: the grid spread over the SMs, capped by what fits on one SM.
    resident = np.minimum(bps, c_active[inv])
    achieved[idx] = np.minimum(resident * c_warps_per_block[inv] / c_max_warps[inv], 1.0)
    # Each row's limits by its configuration's, as references: a Python int per row (two
    # lists of the rows' numbers) would take tens of MB on a multi-GB trace.
    by_config = np.empty(len(configs), dtype=object)
    for c, limit in enumerate(c_limit):
        by_config[c] = limit
    per_row = np.empty(n, dtype=object)
    per_row.fill(())
    per_row[idx] = by_config[inv]
    return theo, achieved, sm_eff, per_sm, per_row.tolist()


def _theoretical(occupancy: Any, cc: tuple[int, int], threads: int, regs: int, smem: int) -> Any:
    from gpudiag.errors import GpuDiagError

    # Kineto records static + dynamic shared memory together; static is capped at 48 KiB,
    # so anything above it must have been dynamic.
    static, dynamic = (smem, 0) if smem <= 48 * 1024 else (0, smem)
    try:
        return occupancy(cc, threads, regs, smem_per_block=static, dynamic_smem_per_block=dynamic)
    except (GpuDiagError, ValueError, TypeError):
        return None


def _weighted(values: F64, weights: F64) -> float | None:
    ok = np.isfinite(values)
    if not ok.any() or weights[ok].sum() <= 0:
        return None
    return float(np.sum(values[ok] * weights[ok]) / np.sum(weights[ok]))


def kernel_table(
    events: Events,
    cols: KernelColumns,
    launched_by: np.ndarray | None = None,
    op_dtypes: np.ndarray | None = None,
) -> tuple[KernelStats, ...]:
    """Per-name statistics of the kernels (not memcpy/memset/sync) among ``cols.rows``.

    ``launched_by`` / ``op_dtypes`` (aligned with ``cols.rows``): the launching operator's
    name and the dtype its recorded Input type says (None where unknown)."""
    is_kernel = events.kind[cols.rows] == Kind.KERNEL
    rows = cols.rows[is_kernel]
    if rows.size == 0:
        return ()
    dur = events.dur[rows]
    uniq, inv = dense_codes(events.name[rows])
    count = np.bincount(inv)
    total = np.bincount(inv, weights=dur)
    sq = np.bincount(inv, weights=dur * dur)
    mins = np.full(uniq.size, np.inf)
    maxs = np.full(uniq.size, -np.inf)
    np.minimum.at(mins, inv, dur)
    np.maximum.at(maxs, inv, dur)
    short = np.bincount(inv, weights=(dur < SHORT_KERNEL_US).astype(float))
    grand = float(total.sum()) or 1.0
    sub = np.flatnonzero(is_kernel)
    theo, achieved = cols.theoretical[sub], cols.achieved[sub]
    sm_eff, per_sm = cols.sm_efficiency[sub], cols.blocks_per_sm[sub]
    tensor = cols.tensor_cores[sub]
    cats = cols.category[sub]
    extra = events.extra[rows]
    cfg_of, configs = _launch_configs(events.launches, extra)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
    out: list[KernelStats] = []
    for g in range(uniq.size):
        members = order[bounds[g] : bounds[g + 1]]
        w = dur[members]
        n = int(count[g])
        mean = total[g] / n
        var = (sq[g] - n * mean * mean) / (n - 1) if n > 1 else 0.0
        grid = block = None
        regs = smem = None
        limit: tuple[str, ...] = ()
        xs = extra[members]
        if (xs >= 0).any():
            # The launch configuration that accounts for the most time (ties: the one seen
            # first). A config's time is its launches' durations added in row order.
            launched = members[xs >= 0]
            cfg = cfg_of[launched]
            kinds, first_at, code = np.unique(cfg, return_index=True, return_inverse=True)
            in_order = np.argsort(first_at, kind="stable")
            totals = np.bincount(code.reshape(-1), weights=dur[launched])[in_order]
            best_at = int(first_at[in_order[int(np.argmax(totals))]])
            best = configs[int(kinds[in_order[int(np.argmax(totals))]])]
            grid, block = best[0], best[1]
            regs = best[2] if best[2] >= 0 else None
            smem = best[3] if best[3] >= 0 else None
            limit = cols.limited_by[sub[launched[best_at]]] if cols.limited_by else ()
        launcher = None
        if launched_by is not None:
            ops = launched_by[sub[members]]
            known = Counter(o for o in ops.tolist() if o)
            if known:
                # The operator that launched most of them; a tie goes to the first seen.
                launcher = max(known, key=known.__getitem__)
        op_dtype = None
        if op_dtypes is not None:
            by_dtype: dict[str, float] = {}
            for d, us in zip(op_dtypes[sub[members]].tolist(), w.tolist(), strict=True):
                if d:
                    by_dtype[d] = by_dtype.get(d, 0.0) + us
            if by_dtype:
                op_dtype = max(by_dtype, key=by_dtype.__getitem__)
        kname = events.names[int(uniq[g])]
        said = classify_kernel(kname)
        dtype, dtype_source = kernel_dtype(kname, op_dtype)
        out.append(
            KernelStats(
                name=kname,
                category=str(cats[members[0]]),
                count=n,
                total_us=float(total[g]),
                mean_us=float(mean),
                min_us=float(mins[g]),
                max_us=float(maxs[g]),
                std_us=float(np.sqrt(max(var, 0.0))),
                share=float(total[g] / grand),
                tensor_cores=bool(tensor[members].any()),
                grid=grid,
                block=block,
                registers_per_thread=regs,
                shared_memory_bytes=smem,
                blocks_per_sm=_weighted(per_sm[members], w),
                theoretical_occupancy=_weighted(theo[members], w),
                achieved_occupancy=_weighted(achieved[members], w),
                sm_efficiency=_weighted(sm_eff[members], w),
                occupancy_limited_by=limit,
                launched_by=launcher,
                short_calls=int(short[g]),
                family=said.family,
                provider=said.provider,
                vendor=said.vendor,
                tensor_cores_known=said.tensor_cores is not None,
                dtype=dtype,
                dtype_source=dtype_source,
            )
        )
    out.sort(key=lambda k: -k.total_us)
    return tuple(out)


@dataclass(frozen=True, eq=False)
class _Calls:
    """The operator calls among some GPU rows, numbered in first-seen order: each call's name,
    its kernels' time, the part on tensor cores, the part whose kernels' names cannot tell,
    and (call, kernel name, time) for each of its kernels in the order its rows show them.
    Times are added in row order, as a running sum would; arrays, not a dict per call."""

    names: list[str]
    kernel_us: list[float]
    tc_us: list[float]
    unknown_us: list[float]
    pair_call: list[int]
    pair_kernel: list[str]
    pair_us: list[float]


def _per_call(
    events: Events,
    cols: KernelColumns,
    op_of_row: I64,
    op_names: Sequence[str | None],
    idx: I64,
    dur: F64,
) -> _Calls:
    if idx.size == 0:
        return _Calls([], [], [], [], [], [], [])
    calls, first, code = np.unique(op_of_row[idx], return_index=True, return_inverse=True)
    rank = np.empty(calls.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(calls.size)
    call = rank[code.reshape(-1)]  # call number of each row, numbered in first-seen order
    d = dur[idx]
    tc = cols.tensor_cores[idx]
    unknown = (
        ~tc & cols.tensor_cores_unknown[idx]
        if cols.tensor_cores_unknown is not None
        else np.zeros(idx.size, dtype=bool)
    )
    kernel_us = np.bincount(call, weights=d, minlength=calls.size)
    tc_us = np.bincount(call, weights=np.where(tc, d, 0.0), minlength=calls.size)
    unknown_us = np.bincount(call, weights=np.where(unknown, d, 0.0), minlength=calls.size)
    kname = events.name[cols.rows[idx]].astype(np.int64)
    width = int(kname.max()) + 1
    pair = call * width + kname
    pairs, pair_first, pair_code = np.unique(pair, return_index=True, return_inverse=True)
    pair_us = np.bincount(pair_code.reshape(-1), weights=d, minlength=pairs.size)
    order = np.lexsort((pair_first, pairs // width))
    first_rows = idx[first[np.argsort(rank)]]
    return _Calls(
        names=[op_names[r] or "?" for r in first_rows.tolist()],
        kernel_us=kernel_us.tolist(),
        tc_us=tc_us.tolist(),
        unknown_us=unknown_us.tolist(),
        pair_call=(pairs[order] // width).tolist(),
        pair_kernel=[events.names[k] for k in (pairs[order] % width).tolist()],
        pair_us=pair_us[order].tolist(),
    )


@dataclass(frozen=True, eq=False)
class _Numbered:
    number: I64  # of each row: the number of its tuple of values
    first: I64  # of each number: the first row with that tuple


def _numbered(columns: Sequence[np.ndarray]) -> _Numbered:
    """Number the distinct tuples of values across integer columns (row-wise), from one int64
    code per row built from each column's dense codes: no Python tuple per row (a
    multi-GB trace has millions of launches), no sorted copies of a many-column array."""
    code = np.zeros(columns[0].size, dtype=np.int64)
    span = 1
    for column in columns:
        values, dense = np.unique(column, return_inverse=True)
        span *= values.size
        code = code * values.size + dense.reshape(-1)
    if span >= 1 << 62:  # too many distinct values for one int64 (a damaged file)
        code = np.stack(columns, axis=1)
    _, first, number = np.unique(code, axis=0, return_index=True, return_inverse=True)
    return _Numbered(number.reshape(-1), first)


class _Numbers(dict[Any, int]):
    """Values numbered in the order first seen."""

    def __missing__(self, key: Any) -> int:
        value = self[key] = len(self)
        return value


def _launch_configs(
    lt: LaunchTable, extra: np.ndarray
) -> tuple[I64, list[tuple[Any, Any, int, int]]]:
    """A number per launch configuration (grid, block, registers, shared memory) of each row
    (-1: no launch recorded), and the configurations by number. Arrays, not lists of Python
    ints: a multi-GB trace has millions of launches."""
    out = np.full(extra.size, -1, dtype=np.int64)
    at = np.flatnonzero(extra >= 0)
    if at.size == 0:
        return out, []
    x = extra[at]
    dims = _Numbers()
    grid = np.fromiter(map(dims.__getitem__, map(lt.grid.__getitem__, x)), np.int64, x.size)
    block = np.fromiter(map(dims.__getitem__, map(lt.block.__getitem__, x)), np.int64, x.size)
    numbered = _numbered((grid, block, lt.registers_per_thread[x], lt.shared_memory_bytes[x]))
    out[at] = numbered.number
    first = numbered.first
    configs = [
        (lt.grid[r], lt.block[r], int(lt.registers_per_thread[r]), int(lt.shared_memory_bytes[r]))
        for r in x[first].tolist()
    ]
    return out, configs


def tensor_core_use(
    events: Events, cols: KernelColumns, op_of_row: I64, op_names: Sequence[str | None]
) -> TensorCoreUse:
    """Tensor-core share and the eligible operators whose kernels did not use them.

    ``op_of_row[i]`` is the host row of the operator that launched GPU row ``cols.rows[i]``
    (-1: unknown); ``op_names[i]`` its name.
    """
    compute = (cols.category == COMPUTE) & (events.kind[cols.rows] == Kind.KERNEL)
    dur = events.dur[cols.rows]
    compute_us = float(dur[compute].sum())
    tc_us = float(dur[compute & cols.tensor_cores].sum())
    unknown_us = (
        float(dur[compute & cols.tensor_cores_unknown].sum())
        if cols.tensor_cores_unknown is not None
        else 0.0
    )
    share = tc_us / compute_us if compute_us > 0 else None
    linked = compute & (op_of_row >= 0)
    linked_us = float(dur[linked].sum())
    linked_share = linked_us / compute_us if compute_us > 0 else 0.0
    if linked_us <= 0:
        return TensorCoreUse(share, tc_us, compute_us, None, (), linked_share, unknown_us)
    idx = np.flatnonzero(linked)
    # Only calls of operators that could use tensor cores (decided once per operator call).
    _, first, code = np.unique(op_of_row[idx], return_index=True, return_inverse=True)
    eligible = np.array(
        [is_tensor_core_eligible_op(op_names[i] or "?") for i in idx[first].tolist()], dtype=bool
    )
    idx = idx[eligible[code.reshape(-1)]]
    calls = _per_call(events, cols, op_of_row, op_names, idx, dur)
    by_name: dict[str, list[Any]] = {}
    without = 0.0
    at = 0  # the next (call, kernel) pair
    n_pairs = len(calls.pair_call)
    for c, (name, kernel_us, tc, unknown) in enumerate(
        zip(calls.names, calls.kernel_us, calls.tc_us, calls.unknown_us, strict=True)
    ):
        agg = by_name.setdefault(name, [0, 0.0, 0.0, {}, 0.0])
        agg[0] += 1
        agg[1] += kernel_us
        # A call that used tensor cores for its main kernel counts as using them, even if a
        # small helper kernel (an offsets or bias kernel) did not; one whose kernels' names
        # cannot tell counts as unknown, not as "without".
        agg[2] += kernel_us if tc > 0 else 0.0
        if tc <= 0 and unknown > 0:
            agg[4] += kernel_us
        elif tc <= 0:
            without += kernel_us
        kernels = agg[3]
        while at < n_pairs and calls.pair_call[at] == c:
            k = calls.pair_kernel[at]
            kernels[k] = kernels.get(k, 0.0) + calls.pair_us[at]
            at += 1
    ops = tuple(
        sorted(
            (
                EligibleOp(
                    name=name,
                    count=c,
                    kernel_us=k_us,
                    tensor_core_us=t_us,
                    top_kernel=short_name(max(ks, key=ks.__getitem__)),
                    unknown_us=u_us,
                )
                for name, (c, k_us, t_us, ks, u_us) in by_name.items()
            ),
            key=lambda o: -o.without_tensor_cores_us,
        )
    )
    return TensorCoreUse(share, tc_us, compute_us, without, ops, linked_share, unknown_us)
