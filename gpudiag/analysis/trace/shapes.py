"""Input shapes of the costed operators (matmul, convolution, attention) and their GEMM sizes.

Only the outermost costed operator of a nest is kept (``aten::linear`` calls ``aten::addmm``:
the work is counted once, under the name the user's code called). Its GPU time is the time of
the kernels launched inside it, tied through the launching runtime call as the tensor-core
analysis ties them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.costed_ops import dtype_of, is_matmul
from gpudiag.analysis.costed_ops import is_costed as costed_name
from gpudiag.analysis.trace.intervals import merge
from gpudiag.analysis.trace.model import I64, Bool, Events, Ids, Kind, OpInputs, fields_json
from gpudiag.analysis.trace.nesting import Nesting
from gpudiag.analysis.trace.window import Step, step_of

Shape = tuple[int, ...]


@dataclass(frozen=True)
class GemmDims:
    """A matrix product C[M, N] = A[M, K] @ B[K, N], ``batch`` times.

    ``m_from_batch``: M is the rows of the activations (batch x sequence) of a layer called on
    them (``linear``, ``addmm``, ``x @ W``), so it follows from the batch size, not the model.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    m_from_batch: bool = False

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


def gemm_dims(name: str, shapes: Sequence[Shape]) -> GemmDims | None:
    """M, N, K and batch of a matmul-like operator from its input shapes (None: not a
    matrix-matrix product, or shapes not recorded)."""
    try:
        if name == "aten::linear":
            x, w = shapes[0], shapes[1]
            if len(x) < 2 or len(w) != 2:
                return None
            dims = GemmDims(math.prod(x[:-1]), w[0], x[-1], 1, True)
        elif name in ("aten::addmm", "aten::mm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::addmm" else (shapes[0], shapes[1])
            if len(a) != 2 or len(b) != 2:
                return None
            dims = GemmDims(a[0], b[1], a[1], 1, name == "aten::addmm")
        elif name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::baddbmm" else (shapes[0], shapes[1])
            if len(a) != 3 or len(b) != 3:
                return None
            dims = GemmDims(a[1], b[2], a[2], a[0])
        elif name == "aten::matmul" or not name.startswith("aten::"):
            # aten::matmul, or a custom operator named like one: A[..., M, K] @ B[..., K, N].
            a, b = shapes[0], shapes[1]
            if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
                return None
            if len(b) == 2:  # x @ W: torch folds the leading dims of x into M
                dims = GemmDims(math.prod(a[:-1]), b[1], a[-1], 1, True)
            else:
                lead = a[:-2] if len(a) >= len(b) else b[:-2]
                dims = GemmDims(a[-2], b[-1], a[-1], math.prod(lead))
        else:
            return None
    except (IndexError, TypeError):
        return None
    return dims if min(dims.m, dims.n, dims.k, dims.batch) > 0 else None


@dataclass(frozen=True)
class ShapedOp:
    """One call of a costed operator, as ``record_shapes=True`` recorded it.

    Times in microseconds. ``gpu_us``: time of the kernels it launched (None when the trace
    has no kernels tied to operators); ``tensor_core_us``: the part of it in tensor-core
    kernels. ``cpu_us``: its own host duration, which on a GPU run is launch time, not work.
    Satisfies ``gpudiag.analysis.roofline.OpRecord``.
    """

    name: str
    input_shapes: tuple[Shape, ...]
    input_types: tuple[str, ...]
    concrete_inputs: tuple[str, ...]
    ts: float
    tid: str
    cpu_us: float
    gpu_us: float | None
    tensor_core_us: float | None
    step: int | None
    # Input types of the innermost costed operator inside this one (``aten::addmm`` inside
    # ``aten::linear``): under autocast the outer operator records its inputs before the
    # cast, the inner one the dtype the work ran in. Empty when nothing costed is nested.
    compute_types: tuple[str, ...] = ()
    # A product of attention (Q K^T or P V of an eager attention call): its sizes are the
    # sequence length and head size, which a fused attention backend handles, not padding.
    in_attention: bool = False

    @property
    def dtype(self) -> str | None:
        """The dtype the work ran in (the innermost costed operator's inputs)."""
        return dtype_of(self.compute_types) or dtype_of(self.input_types)

    @property
    def compute_dtype(self) -> str | None:
        """``dtype``, but "tf32" for fp32 work whose kernels ran on tensor cores (the roofline
        then compares it with the TF32 roof, not the fp32 one)."""
        dtype = self.dtype
        if dtype == "fp32" and self.tensor_core_us and self.gpu_us:
            return "tf32" if self.tensor_core_us >= 0.5 * self.gpu_us else dtype
        return dtype

    @property
    def gemm(self) -> GemmDims | None:
        return gemm_dims(self.name, self.input_shapes) if is_matmul(self.name) else None

    @property
    def duration_us(self) -> float:
        """The op's work time: its kernels' time, or its host time on a CPU-only trace."""
        return self.gpu_us if self.gpu_us is not None else self.cpu_us

    @property
    def dur(self) -> float:
        """Kineto's ``dur`` (host time): what the roofline's nesting check compares."""
        return self.cpu_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["dtype"] = self.dtype
        return out


@dataclass(frozen=True)
class GemmShape:
    """Calls of one matmul-like operator with the same input shapes and dtype."""

    name: str
    input_shapes: tuple[Shape, ...]
    dtype: str | None
    dims: GemmDims
    count: int
    gpu_us: float | None  # summed over the calls; None when the trace cannot tell
    tensor_core_us: float | None
    cpu_us: float
    in_attention: bool = False  # the products of eager attention (see ShapedOp)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["dims"] = self.dims.to_dict()
        return out


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def gemm_shapes(ops: Iterable[ShapedOp]) -> tuple[GemmShape, ...]:
    """Matmul-like calls grouped by (name, shapes, dtype), most GPU time first (host time
    when no GPU time is known)."""
    groups: dict[tuple[str, tuple[Shape, ...], str | None, bool], list[ShapedOp]] = {}
    dims_of: dict[tuple[str, tuple[Shape, ...], str | None, bool], GemmDims] = {}
    for op in ops:
        key = (op.name, op.input_shapes, op.dtype, op.in_attention)
        if key not in groups:
            dims = op.gemm
            if dims is None:
                continue
            dims_of[key] = dims
            groups[key] = []
        groups[key].append(op)
    out = [
        GemmShape(
            name=key[0],
            input_shapes=key[1],
            dtype=key[2],
            dims=dims_of[key],
            count=len(calls),
            gpu_us=_sum([c.gpu_us for c in calls]),
            tensor_core_us=_sum([c.tensor_core_us for c in calls]),
            cpu_us=sum(c.cpu_us for c in calls),
            in_attention=key[3],
        )
        for key, calls in groups.items()
    ]
    out.sort(key=lambda g: (-(g.gpu_us or 0.0), -g.cpu_us))
    return tuple(out)


class _Outermost:
    """The outermost costed operator at or above an operator row (-1: none), memoised."""

    def __init__(self, parent_op: Ids, is_costed: Bool) -> None:
        self.parent = parent_op
        self.costed = is_costed
        self.memo: dict[int, int] = {}

    def __call__(self, row: int) -> int:
        memo, parent = self.memo, self.parent
        path: list[int] = []
        r = row
        while r >= 0 and r not in memo:
            path.append(r)
            r = int(parent[r])
        best = memo[r] if r >= 0 else -1
        for p in reversed(path):  # from the top of the nest down
            if best < 0 and self.costed[p]:
                best = p
            memo[p] = best
        return memo[row]


def _within(events: Events, rows: I64, spans: I64) -> Bool:
    """Whether each row starts inside one of the ``spans`` rows on its own thread: a cheap
    necessary condition for having one of them as an ancestor."""
    out = np.zeros(rows.size, dtype=bool)
    for thread in np.unique(events.thread[spans]).tolist():
        mine = spans[events.thread[spans] == thread]
        starts, ends = merge(events.ts[mine], events.ts[mine] + events.dur[mine])
        sel = np.flatnonzero(events.thread[rows] == thread)
        ts = events.ts[rows[sel]]
        i = np.searchsorted(starts, ts, side="right") - 1
        out[sel] = (i >= 0) & (ts <= ends[np.clip(i, 0, None)])
    return out


def shaped_ops(
    events: Events,
    nesting: Nesting,
    host: Bool,
    steps: tuple[Step, ...],
    gpu_rows: I64,
    op_of_row: I64,
    tensor_cores: Bool,
    attention_rows: frozenset[int] = frozenset(),
) -> tuple[ShapedOp, ...]:
    """The outermost costed operators among the ``host`` rows, in time order.

    ``op_of_row[i]``: the operator row that launched GPU row ``gpu_rows[i]`` (-1: unknown);
    ``tensor_cores[i]``: whether that GPU row ran on tensor cores; ``attention_rows``: the
    rows of attention's products (``ShapedOp.in_attention``).
    """
    costed_ids = np.array([i for i, n in enumerate(events.names) if costed_name(n)], np.int32)
    if costed_ids.size == 0:
        return ()
    is_costed = (events.kind == Kind.CPU_OP) & events.name_in(costed_ids)
    rows = np.flatnonzero(is_costed & host)
    if rows.size == 0:
        return ()
    outer = _Outermost(nesting.parent_op, is_costed)
    # A custom operator that wraps ATen's product (vllm::rocm_unquantized_gemm around
    # aten::mm) is a wrapper: the ATen call inside it is the one costed, with its own shapes.
    custom = {r for r in rows.tolist() if not events.names[events.name[r]].startswith("aten::")}
    if custom:
        wrappers = {o for r in rows.tolist() if (o := outer(r)) != r and o in custom}
        if wrappers:
            is_costed[np.fromiter(wrappers, dtype=np.int64, count=len(wrappers))] = False
            rows = np.flatnonzero(is_costed & host)
            outer = _Outermost(nesting.parent_op, is_costed)
    linked = (events.kind[gpu_rows] == Kind.KERNEL) & (op_of_row >= 0)
    gpu_known = bool(linked.any())
    # Most kernels come from element-wise operators far from any matmul: skip the walk up
    # their nest unless they start inside a costed operator.
    linked[linked] = _within(events, op_of_row[linked], np.flatnonzero(is_costed))
    gpu_us: dict[int, float] = {}
    tc_us: dict[int, float] = {}
    if linked.any():
        launchers, inv = np.unique(op_of_row[linked], return_inverse=True)
        top = np.array([outer(o) for o in launchers.tolist()], dtype=np.int64)[inv]
        dur = events.dur[gpu_rows[linked]]
        on_tc = tensor_cores[linked]
        mine = top >= 0
        keys, code = np.unique(top[mine], return_inverse=True)
        total = np.bincount(code, weights=dur[mine], minlength=keys.size)
        tc = np.bincount(code, weights=np.where(on_tc[mine], dur[mine], 0.0), minlength=keys.size)
        gpu_us = dict(zip(keys.tolist(), total.tolist(), strict=True))
        tc_us = dict(zip(keys.tolist(), tc.tolist(), strict=True))
    # The innermost costed operator of each nest: the last-starting costed row under it (of
    # rows starting together, the last in the file).
    tops = np.array([outer(r) for r in rows.tolist()], dtype=np.int64)
    under = np.flatnonzero(tops != rows)
    by_start = under[np.lexsort((rows[under], events.ts[rows[under]], tops[under]))]
    last = np.ones(by_start.size, dtype=bool)
    last[:-1] = tops[by_start[1:]] != tops[by_start[:-1]]
    inner = dict(zip(tops[by_start[last]].tolist(), rows[by_start[last]].tolist(), strict=True))
    rows = rows[tops == rows]
    columns = zip(
        rows.tolist(),
        events.name[rows].tolist(),
        events.thread[rows].tolist(),
        events.ts[rows].tolist(),
        events.dur[rows].tolist(),
        step_of(steps, events.ts[rows]).tolist(),
        strict=True,
    )
    no_inputs = OpInputs(None, None, None)
    out: list[ShapedOp] = []
    for row, name, thread, ts, dur, si in columns:
        inputs = events.inputs.get(row, no_inputs)
        nested = events.inputs.get(inner.get(row, -1), no_inputs)
        out.append(
            ShapedOp(
                name=events.names[name],
                input_shapes=inputs.dims or (),
                input_types=inputs.types or (),
                concrete_inputs=inputs.concrete or (),
                ts=ts,
                tid=events.threads[thread][1],
                cpu_us=dur,
                gpu_us=gpu_us.get(row, 0.0) if gpu_known else None,
                tensor_core_us=tc_us.get(row, 0.0) if gpu_known else None,
                step=steps[si].number if si >= 0 else None,
                compute_types=nested.types or (),
                # The product itself, or the costed call inside it (an einsum's bmm).
                in_attention=row in attention_rows or int(nesting.parent_op[row]) in attention_rows,
            )
        )
    out.sort(key=lambda o: o.ts)
    return tuple(out)
