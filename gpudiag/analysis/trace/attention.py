"""Attention in a trace, read from the operator tree: eager (hand-written, or SDPA's math path)
or fused, and the time it takes.

Eager attention is ``matmul(Q, K^T) -> [scale, mask, bias] -> softmax -> [dropout] ->
matmul(P, V)`` as sibling operators under one parent (a module's forward, SDPA's math
operator, or the top of a thread when the profile recorded no modules). A softmax without a
matmul on both sides (a classifier head, a gate, a convex sum) is not attention. Fused
attention is one operator: SDPA's flash / efficient / cuDNN backends or a library's
attention operator (flash-attn, aiter's mha, FlashInfer, ...). A fused-attention kernel (by
its name, ``kernel_classes.ATTENTION_FAMILIES``) that no recorded operator launched, as in a
CUDA/HIP graph replay where only the graph launch is recorded, or work queued before the
capture began, is counted apart (``unlaunched_kernels``), under its library's name.

Times are the kernels the operators launched (GPU traces) or the operators' own time
(CPU-only traces), in microseconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpudiag.analysis.trace.kernel_classes import ATTENTION_FAMILIES, classify_kernel
from gpudiag.analysis.trace.model import I64, Bool, Events, Ids, Kind, fields_json
from gpudiag.analysis.trace.nesting import Nesting

SOFTMAX_OPS = frozenset(
    {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax"}
)
SOFTMAX_BACKWARD_OPS = frozenset({"aten::_softmax_backward_data"})
# QK^T and PV: batched products of activations (not aten::linear, a projection by weights).
SCORE_MATMULS = frozenset(
    {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum", "aten::mm"}
)
# What hand-written attention does between the two products: scale, mask, bias, casts,
# dropout, the views around them, and the small tensors a mask or a scale is made of
# (GPT-2's torch.full scale and torch.where mask, a causal mask built from comparisons).
_BETWEEN = re.compile(
    r"^aten::(?:div|mul|add|sub|neg|masked_fill|where|to|_to_copy|type_as|dropout|"
    r"native_dropout|feature_dropout|contiguous|clone|transpose|permute|view|reshape|"
    r"_reshape_alias|expand|unsqueeze|squeeze|t|empty_like|copy|float|half|bfloat16|"
    r"detach|alias|select|slice|triu|tril|full|full_like|ones_like|zeros_like|fill|empty|"
    r"empty_strided|zeros|ones|arange|scalar_tensor|lift_fresh|_unsafe_view|result_type|"
    r"lt|gt|le|ge|eq|ne|logical_not|bitwise_not|logical_and|logical_or|minimum|maximum|"
    r"clamp|clamp_min|tanh|rsub|index|_local_scalar_dense|item|is_nonzero)_?$"
)
MATH_OP = "aten::_scaled_dot_product_attention_math"
# SDPA's fused backends, by the operator its dispatcher calls.
SDPA_BACKENDS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_efficient_attention_forward": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused",
}
# Other libraries' fused attention operators (flash-attn, aiter, FlashInfer, vLLM, xformers).
_LIBRARY_ATTENTION = re.compile(
    r"flash_?attn|flashinfer|::mha|fmha|unified_attention|xformers", re.I
)
_LOOKAROUND = 16  # sibling operators searched on each side of a softmax


@dataclass(frozen=True)
class AttentionUse:
    """Eager and fused attention in one trace (or several ranks together)."""

    eager_calls: int = 0  # hand-written: softmax(Q K^T) V in the model's own code
    forward_us: float = 0.0  # the eager calls' operators, QK^T through PV
    softmax_us: float = 0.0  # of it, in softmax
    backward_us: float = 0.0  # the eager calls' backward (part measured, part estimated)
    backward_measured_us: float = 0.0  # of it, softmax backward (measured, in proportion)
    math_calls: int = 0  # SDPA's math path (the same pattern inside its math operator)
    math_us: float = 0.0  # their operators' time, forward
    fused_calls: int = 0
    fused_us: float = 0.0
    fused_backends: tuple[str, ...] = ()
    # Fused-attention kernels no recorded operator launched (a CUDA/HIP graph replay, or work
    # queued before the capture began), by their library: counted apart from the calls above.
    unlaunched_kernels: int = 0
    unlaunched_us: float = 0.0
    unlaunched_libraries: tuple[str, ...] = ()
    pattern: tuple[str, ...] = ()  # the operators of one eager call, in order
    timed_on: str = "gpu"  # "gpu": kernels the operators launched; "host": operator time
    # Host rows of the QK^T / PV operators of eager calls (for the shape rules).
    matmul_rows: frozenset[int] = field(default=frozenset(), repr=False, compare=False)
    # GPU rows of the hand-written calls' kernels: their forward, and their softmax backward
    # when every softmax is attention (for the time ledger's eager-attention row).
    eager_kernel_rows: frozenset[int] = field(default=frozenset(), repr=False, compare=False)

    @property
    def eager_us(self) -> float:
        return self.forward_us + self.backward_us

    @property
    def found(self) -> bool:
        return (
            self.eager_calls > 0
            or self.math_calls > 0
            or self.fused_calls > 0
            or self.unlaunched_kernels > 0
        )

    def to_dict(self) -> dict[str, Any]:
        out = fields_json(self)
        out.pop("matmul_rows", None)
        out.pop("eager_kernel_rows", None)
        out["eager_us"] = self.eager_us
        return out

    @classmethod
    def merged(cls, parts: Iterable[AttentionUse]) -> AttentionUse:
        items = list(parts)
        if not items:
            return cls()
        return cls(
            eager_calls=sum(p.eager_calls for p in items),
            forward_us=sum(p.forward_us for p in items),
            softmax_us=sum(p.softmax_us for p in items),
            backward_us=sum(p.backward_us for p in items),
            backward_measured_us=sum(p.backward_measured_us for p in items),
            math_calls=sum(p.math_calls for p in items),
            math_us=sum(p.math_us for p in items),
            fused_calls=sum(p.fused_calls for p in items),
            fused_us=sum(p.fused_us for p in items),
            fused_backends=tuple(dict.fromkeys(b for p in items for b in p.fused_backends)),
            unlaunched_kernels=sum(p.unlaunched_kernels for p in items),
            unlaunched_us=sum(p.unlaunched_us for p in items),
            unlaunched_libraries=tuple(
                dict.fromkeys(b for p in items for b in p.unlaunched_libraries)
            ),
            pattern=next((p.pattern for p in items if p.pattern), ()),
            timed_on=items[0].timed_on,
        )


class _Work:
    """Time of an operator with everything it called: its kernels' time on a GPU trace
    (tied through ``op_of_row``), its own duration on a CPU-only trace."""

    def __init__(
        self, events: Events, nesting: Nesting, gpu_rows: I64, op_of_row: I64, wanted: set[int]
    ) -> None:
        self.events = events
        linked = (events.kind[gpu_rows] == Kind.KERNEL) & (op_of_row >= 0)
        self.on_gpu = bool(linked.any())
        self.us: dict[int, float] = dict.fromkeys(wanted, 0.0)
        # The wanted operator each linked kernel belongs to (-1: none), and those kernels.
        self.kernel_rows = gpu_rows[linked]
        self.kernel_owner = np.full(self.kernel_rows.size, -1, dtype=np.int64)
        if not self.on_gpu:
            for r in wanted:
                self.us[r] = float(events.dur[r])
            return
        memo: dict[int, int] = {}
        parent = nesting.parent_op
        launchers, inv = np.unique(op_of_row[linked], return_inverse=True)
        dur = np.bincount(inv, weights=events.dur[gpu_rows[linked]])
        owners = np.full(launchers.size, -1, dtype=np.int64)
        for i, (op, us) in enumerate(zip(launchers.tolist(), dur.tolist(), strict=True)):
            owner = self._owner(op, parent, wanted, memo)
            owners[i] = owner
            if owner >= 0:
                self.us[owner] += us
        self.kernel_owner = owners[inv]

    def kernels_of(self, owners: set[int]) -> frozenset[int]:
        """The GPU rows of the kernels the given operators (and their children) launched."""
        if not owners or self.kernel_rows.size == 0:
            return frozenset()
        mine = np.isin(self.kernel_owner, np.fromiter(owners, dtype=np.int64, count=len(owners)))
        return frozenset(self.kernel_rows[mine].tolist())

    @staticmethod
    def _owner(op: int, parent: Ids, wanted: set[int], memo: dict[int, int]) -> int:
        path = []
        row = op
        while row >= 0 and row not in wanted and row not in memo:
            path.append(row)
            row = int(parent[row])
        owner = row if row in wanted else memo.get(row, -1) if row >= 0 else -1
        for p in path:
            memo[p] = owner
        return owner


def _backend(op: str) -> str:
    """SDPA's backend name, or the library's attention ("mha", "flashinfer", ...) without
    the per-call numbering some profilers add to operator names."""
    if op in SDPA_BACKENDS:
        return SDPA_BACKENDS[op]
    m = _LIBRARY_ATTENTION.search(op)
    return m.group(0).strip(":").lower() if m else op


def _siblings(events: Events, nesting: Nesting, host: Bool, keys: set[tuple[int, int]]) -> Any:
    """(thread, parent) -> host operator rows with that parent, in time order."""
    ops = np.flatnonzero(host & (events.kind == Kind.CPU_OP))
    parents = {p for _, p in keys}
    ops = ops[np.isin(nesting.parent_op[ops], np.array(sorted(parents), dtype=np.int64))]
    ops = ops[np.lexsort((ops, events.ts[ops]))]
    groups: dict[tuple[int, int], list[int]] = {}
    for r, t, p in zip(
        ops.tolist(), events.thread[ops].tolist(), nesting.parent_op[ops].tolist(), strict=True
    ):
        if (t, p) in keys:
            groups.setdefault((t, p), []).append(r)
    return groups


def _neighbour_matmul(names: list[str], start: int, step: int) -> int | None:
    """Index of the first score matmul from ``start`` in direction ``step``, past only the
    operators attention does between its products (None: something else comes first)."""
    i = start + step
    for _ in range(_LOOKAROUND):
        if not 0 <= i < len(names):
            return None
        if names[i] in SCORE_MATMULS:
            return i
        if not _BETWEEN.match(names[i]):
            return None
        i += step
    return None


def _inside(row: int, parent: Ids, name_of: Any, target: str, depth: int = 4) -> bool:
    for _ in range(depth):
        row = int(parent[row])
        if row < 0:
            return False
        if name_of(row) == target:
            return True
    return False


def attention_use(
    events: Events, nesting: Nesting, host: Bool, gpu_rows: I64, op_of_row: I64
) -> AttentionUse:
    """Eager and fused attention among the ``host`` operators of one trace.

    ``op_of_row[i]``: the operator row that launched GPU row ``gpu_rows[i]`` (-1: unknown).
    """
    names = events.names
    parent = nesting.parent_op

    def name_of(row: int) -> str:
        return names[int(events.name[row])]

    ids = {n: i for i, n in enumerate(names)}
    softmax_ids = [ids[n] for n in SOFTMAX_OPS if n in ids]
    fused_ids = [
        i
        for n, i in ids.items()
        if n in SDPA_BACKENDS or (_LIBRARY_ATTENTION.search(n) and not n.startswith("aten::"))
    ]
    backward_ids = [ids[n] for n in SOFTMAX_BACKWARD_OPS if n in ids]
    if not softmax_ids and not fused_ids:
        return _without_operator(events, gpu_rows, op_of_row, AttentionUse())
    is_op = host & (events.kind == Kind.CPU_OP)

    def outermost(rows: I64, same: set[int]) -> list[int]:
        return [
            r for r in rows.tolist() if parent[r] < 0 or int(events.name[parent[r]]) not in same
        ]

    softmax = outermost(np.flatnonzero(is_op & events.name_in(softmax_ids)), set(softmax_ids))
    fused = outermost(np.flatnonzero(is_op & events.name_in(fused_ids)), set(fused_ids))
    backward = outermost(np.flatnonzero(is_op & events.name_in(backward_ids)), set(backward_ids))

    groups = _siblings(
        events, nesting, host, {(int(events.thread[r]), int(parent[r])) for r in softmax}
    )
    calls: list[tuple[list[int], int, bool]] = []  # (pattern rows, softmax row, in math path)
    for rows in groups.values():
        seq = [name_of(r) for r in rows]
        pos = {r: i for i, r in enumerate(rows)}
        for s in softmax:
            i = pos.get(s)
            if i is None:
                continue
            qk, pv = _neighbour_matmul(seq, i, -1), _neighbour_matmul(seq, i, +1)
            if qk is None or pv is None:
                continue
            calls.append((rows[qk : pv + 1], s, _inside(s, parent, name_of, MATH_OP)))
    wanted = {r for pattern, _, _ in calls for r in pattern} | set(fused) | set(backward)
    work = _Work(events, nesting, gpu_rows, op_of_row, wanted)
    hand = [(pattern, s) for pattern, s, math in calls if not math]
    math_path = [pattern for pattern, _, math in calls if math]
    forward = sum(work.us[r] for pattern, _ in hand for r in pattern)
    soft = sum(work.us[s] for _, s in hand)
    matmuls = [r for pattern, _, _ in calls for r in (pattern[0], pattern[-1])]
    backward_us = measured = 0.0
    if hand and backward:
        # Softmax backward of these calls (in proportion to the softmax calls that are
        # hand-written attention), and each product's backward: two products of its size.
        measured = sum(work.us[r] for r in backward) * len(hand) / max(len(softmax), 1)
        backward_us = measured + 2.0 * sum(work.us[p[0]] + work.us[p[-1]] for p, _ in hand)
    backends = [_backend(name_of(r)) for r in fused]
    found = AttentionUse(
        eager_calls=len(hand),
        forward_us=forward,
        softmax_us=soft,
        backward_us=backward_us,
        backward_measured_us=measured,
        math_calls=len(math_path),
        math_us=sum(work.us[r] for pattern in math_path for r in pattern),
        fused_calls=len(fused),
        fused_us=sum(work.us[r] for r in fused),
        fused_backends=tuple(dict.fromkeys(backends)),
        pattern=tuple(name_of(r) for r in hand[0][0]) if hand else (),
        timed_on="gpu" if work.on_gpu else "host",
        matmul_rows=frozenset(matmuls),
        eager_kernel_rows=work.kernels_of(
            {r for pattern, _ in hand for r in pattern}
            | (set(backward) if hand and len(hand) == len(softmax) else set())
        ),
    )
    return _without_operator(events, gpu_rows, op_of_row, found)


def _without_operator(
    events: Events, gpu_rows: I64, op_of_row: I64, found: AttentionUse
) -> AttentionUse:
    """``found`` plus the fused-attention kernels no fused-attention operator launched (a
    graph replay records only the graph's launch), by their library."""
    kernels = gpu_rows[events.kind[gpu_rows] == Kind.KERNEL]
    if kernels.size == 0:
        return found
    launchers = op_of_row[events.kind[gpu_rows] == Kind.KERNEL]
    name_ids, inverse = np.unique(events.name[kernels], return_inverse=True)
    library = {
        i: cls.provider or cls.family
        for i, name_id in enumerate(name_ids.tolist())
        if (cls := classify_kernel(events.names[name_id])).family in ATTENTION_FAMILIES
    }
    if not library:
        return found
    calls, us, libraries = 0, 0.0, []
    for k, launcher in enumerate(launchers.tolist()):
        lib = library.get(int(inverse[k]))
        # A kernel an operator launched is that operator's (a fused forward counted above,
        # or a backward operator, which the forward figures leave out).
        if lib is None or launcher >= 0:
            continue
        calls += 1
        us += float(events.dur[kernels[k]])
        libraries.append(lib)
    if not calls:
        return found
    return replace(
        found,
        unlaunched_kernels=calls,
        unlaunched_us=us,
        unlaunched_libraries=tuple(dict.fromkeys(libraries)),
        timed_on="gpu",
    )
