"""The roofline: compute and memory ceilings, and where measured operations sit under them.

``gd.roofline(system, points=...)`` takes ceilings from the spec table (a SystemReport, a GpuSpec
or a GPU name) and from measured ceilings (``gd.bench.matmul()`` / ``gd.bench.bandwidth()``
results), and points as plain ``(name, flops, bytes, seconds)`` records, benchmark results, or
profiler op records via ``points_from_ops``.

Coupling with trace analysis is kept to one duck-typed record (``OpRecord``): anything with a
name, the input shapes, optionally the input dtypes and concrete scalar inputs, and a duration.
Kineto ``cpu_op`` events (``{"name", "dur", "args": {"Input Dims", "Input type"}}``) already have
that shape. The duration should be the GPU time of the op's kernels when known; a CPU op's own
duration on a GPU run is its launch time, not its work.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpudiag import _views
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Grid, Lines
from gpudiag.analysis.costed_ops import (
    ATTENTION_OPS,
    CONV_OPS,
    DTYPE_BYTES,
    dtype_of,
    is_costed,
    is_matmul,
)
from gpudiag.errors import GpuDiagError

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport
    from gpudiag.specs import GpuSpec

    # what names the GPU whose ceilings a roofline draws (see ``roofline``)
    GpuSource = SystemReport | GpuSpec | str | None

MEMORY_BOUND = "memory-bound"
COMPUTE_BOUND = "compute-bound"


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    """One operation: work (FLOPs), traffic (bytes) and its time."""

    name: str
    flops: float
    bytes: float
    seconds: float
    dtype: str | None = None
    source: str = ""

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.bytes if self.bytes > 0 else math.inf

    @property
    def achieved_tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else math.inf

    @property
    def achieved_gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "name": self.name,
                "flops": self.flops,
                "bytes": self.bytes,
                "seconds": self.seconds,
                "dtype": self.dtype,
                "source": self.source,
                "intensity_flop_per_byte": self.intensity,
                "achieved_tflops": self.achieved_tflops,
                "achieved_gbps": self.achieved_gbps,
            }
        )


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A roof: compute in TFLOP/s (per dtype) or memory in GB/s. ``origin`` is "specs",
    "measured" or "estimate"; ``source`` says exactly where it came from."""

    kind: str  # "compute" or "memory"
    value: float
    origin: str
    dtype: str | None = None
    source: str = ""

    @property
    def label(self) -> str:
        if self.kind == "compute":
            return f"{self.dtype} {self.origin} {self.value:.3g} TFLOP/s"
        return f"memory {self.origin} {self.value:.4g} GB/s"

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": self.kind,
                "value": self.value,
                "origin": self.origin,
                "dtype": self.dtype,
                "source": self.source,
            }
        )


_ORIGIN_RANK = {"specs": 0, "estimate": 1, "measured": 2}


@dataclass(frozen=True, slots=True)
class Roofline(Carded):
    """Ceilings and points. ``bound(point)`` uses the theoretical ceiling (specs, then a labelled
    estimate) when there is one, otherwise the measured one."""

    device: str
    ceilings: tuple[Ceiling, ...]
    points: tuple[RooflinePoint, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    default_dtype: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def compute_ceiling(self, dtype: str | None = None) -> Ceiling | None:
        dtype = dtype or self.default_dtype
        roofs = [
            c for c in self.ceilings if c.kind == "compute" and (dtype is None or c.dtype == dtype)
        ]
        if not roofs and dtype is not None:
            roofs = [
                c for c in self.ceilings if c.kind == "compute" and c.dtype == self.default_dtype
            ]
        return (
            min(roofs, key=lambda c: (_ORIGIN_RANK.get(c.origin, 9), -c.value)) if roofs else None
        )

    def memory_ceiling(self) -> Ceiling | None:
        roofs = [c for c in self.ceilings if c.kind == "memory"]
        return (
            min(roofs, key=lambda c: (_ORIGIN_RANK.get(c.origin, 9), -c.value)) if roofs else None
        )

    def ridge_intensity(self, dtype: str | None = None) -> float | None:
        """FLOPs/byte where the memory roof meets the compute roof."""
        compute, memory = self.compute_ceiling(dtype), self.memory_ceiling()
        if compute is None or memory is None or memory.value <= 0:
            return None
        return compute.value * 1e12 / (memory.value * 1e9)

    def attainable_tflops(self, intensity: float, dtype: str | None = None) -> float | None:
        compute, memory = self.compute_ceiling(dtype), self.memory_ceiling()
        if compute is None and memory is None:
            return None
        limits = []
        if compute is not None:
            limits.append(compute.value)
        if memory is not None:
            limits.append(intensity * memory.value * 1e9 / 1e12)
        return min(limits)

    def bound(self, point: RooflinePoint) -> str | None:
        """Memory-bound left of the ridge, compute-bound right of it; None without both roofs."""
        ridge = self.ridge_intensity(point.dtype)
        if ridge is None:
            return None
        return MEMORY_BOUND if point.intensity < ridge else COMPUTE_BOUND

    def efficiency(self, point: RooflinePoint) -> float | None:
        """Achieved / attainable at the point's intensity (1.0 = on the roof)."""
        attainable = self.attainable_tflops(point.intensity, point.dtype)
        return point.achieved_tflops / attainable if attainable else None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "roofline",
                "device": self.device,
                "default_dtype": self.default_dtype,
                "ceilings": self.ceilings,
                "ridge_intensity": self.ridge_intensity(),
                "points": [
                    {**p.to_dict(), "bound": self.bound(p), "efficiency": self.efficiency(p)}
                    for p in self.points
                ],
                "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
                "notes": self.notes,
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def _point_rows(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for p in self.points:
            eff = self.efficiency(p)
            rows.append(
                (
                    p.name,
                    p.dtype or "",
                    f"{p.intensity:.3g}",
                    f"{p.achieved_tflops:.3g}",
                    self.bound(p) or "",
                    f"{eff:.0%}" if eff is not None else "",
                )
            )
        return rows

    def __repr__(self) -> str:
        lines = [f"Roofline for {self.device}"]
        lines += [f"  roof: {c.label} ({c.source})" for c in self.ceilings]
        ridge = self.ridge_intensity()
        if ridge is not None:
            lines.append(f"  ridge at {ridge:.3g} FLOP/byte ({self.default_dtype})")
        for name, dtype, ai, tf, bound, eff in self._point_rows():
            lines.append(f"  {name} [{dtype}]: {ai} FLOP/B, {tf} TFLOP/s, {bound} {eff}".rstrip())
        if self.skipped:
            lines.append(f"  {len(self.skipped)} ops skipped (no FLOP/byte formula or shapes)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        roofs = Grid(
            ("roof", "value", "origin", "source"),
            [
                (
                    c.kind + (f" ({c.dtype})" if c.dtype else ""),
                    f"{c.value:.4g} {'TFLOP/s' if c.kind == 'compute' else 'GB/s'}",
                    c.origin,
                    c.source,
                )
                for c in self.ceilings
            ],
        )
        points = Grid(
            ("op", "dtype", "FLOP/byte", "TFLOP/s", "bound", "of attainable"), self._point_rows()
        )
        return Card("Roofline", [roofs, points, Lines(self.notes, "note")], subtitle=self.device)


# --- building points ---------------------------------------------------------------------------

_POINT_KEYS = ("name", "flops", "bytes", "seconds")


def as_point(item: Any) -> RooflinePoint:
    """A RooflinePoint from a point, a (name, flops, bytes, seconds[, dtype]) tuple or a mapping."""
    if isinstance(item, RooflinePoint):
        return item
    try:
        if isinstance(item, Mapping):
            return RooflinePoint(
                str(item["name"]),
                float(item["flops"]),
                float(item["bytes"]),
                float(item["seconds"]),
                item.get("dtype"),
                str(item.get("source", "")),
            )
        values = tuple(item)
        return RooflinePoint(
            str(values[0]),
            float(values[1]),
            float(values[2]),
            float(values[3]),
            values[4] if len(values) > 4 else None,
        )
    except (KeyError, IndexError, TypeError, ValueError):
        raise GpuDiagError(
            f"Roofline point {item!r}: give (name, flops, bytes, seconds) or a mapping with "
            "those keys."
        ) from None


_ELEM_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def points_from_benchmark(result: Any) -> list[RooflinePoint]:
    """Points from a ``gd.bench`` matmul or attention result (duck-typed: its rows)."""
    points: list[RooflinePoint] = []
    for row in getattr(result, "rows", ()):
        if hasattr(row, "m") and getattr(row, "tflops", None) and row.measurement is not None:
            elem = _ELEM_BYTES.get(row.dtype, 4)
            traffic = (row.m * row.k + row.k * row.n + row.m * row.n) * elem
            points.append(
                RooflinePoint(
                    f"matmul {row.shape}",
                    row.flops,
                    traffic,
                    row.measurement.median_s,
                    row.dtype,
                    "gd.bench.matmul",
                )
            )
        elif hasattr(row, "backend") and getattr(row, "forward", None) is not None and row.correct:
            b, h, d = result.batch, result.heads, result.head_dim
            elem = _ELEM_BYTES.get(result.dtype, 4)
            flops = 4 * b * h * row.seq_len * row.seq_len * d // (2 if result.causal else 1)
            traffic = 4 * b * h * row.seq_len * d * elem  # Q, K, V read, O written (fused kernel)
            points.append(
                RooflinePoint(
                    f"attention {row.backend} S={row.seq_len}",
                    flops,
                    traffic,
                    row.forward.median_s,
                    result.dtype,
                    "gd.bench.attention",
                )
            )
    return points


@runtime_checkable
class OpRecord(Protocol):
    """What ``points_from_ops`` needs from a trace's op: the TraceReport coupling, nothing more."""

    name: str
    input_shapes: Sequence[Sequence[int]]
    duration_us: float


def _field(op: Any, *names: str) -> Any:
    args = op.get("args", {}) if isinstance(op, Mapping) else {}
    for name in names:
        if isinstance(op, Mapping):
            if name in op:
                return op[name]
            if name in args:
                return args[name]
        elif hasattr(op, name):
            return getattr(op, name)
    return None


def _prod(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _matmul_work(name: str, shapes: list[list[int]]) -> tuple[float, int, list[list[int]]]:
    """(FLOPs, output elements, operand shapes counted as traffic)."""
    if name in {"aten::addmm", "aten::baddbmm"}:
        bias, a, b = shapes[0], shapes[1], shapes[2]
        batch = a[0] if name == "aten::baddbmm" else 1
        m, k, n = a[-2], a[-1], b[-1]
        return 2.0 * batch * m * n * k, batch * m * n, [bias, a, b]
    if name == "aten::linear":
        x, w = shapes[0], shapes[1]
        rows = _prod(x[:-1])
        out_f, in_f = w[0], w[1]
        operands = [x, w] + ([shapes[2]] if len(shapes) > 2 and shapes[2] else [])
        return 2.0 * rows * in_f * out_f, rows * out_f, operands
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2:
        raise ValueError("vector operand")
    batch_dims = a[:-2] if len(a) >= len(b) else b[:-2]
    batch = _prod(batch_dims)
    m, k, n = a[-2], a[-1], b[-1]
    return 2.0 * batch * m * n * k, batch * m * n, [a, b]


def _conv_work(
    shapes: list[list[int]], concrete: Sequence[Any] | None
) -> tuple[float, int, list[list[int]]]:
    x, w = shapes[0], shapes[1]
    if not concrete:
        raise ValueError("stride and padding not recorded in the trace")
    spatial = len(x) - 2

    def ints(value: Any, default: int) -> list[int]:
        if value in (None, ""):
            return [default] * spatial
        parsed = ast.literal_eval(value) if isinstance(value, str) else value
        parsed = list(parsed) if isinstance(parsed, (list, tuple)) else [parsed]
        return [int(v) for v in parsed] * (spatial if len(parsed) == 1 else 1)

    # aten::convolution(input, weight, bias, stride, padding, dilation, transposed,
    #                   output_padding, groups)
    stride, padding, dilation = ints(concrete[3], 1), ints(concrete[4], 0), ints(concrete[5], 1)
    groups = (
        int(ast.literal_eval(concrete[8]))
        if len(concrete) > 8 and concrete[8] not in (None, "")
        else 1
    )
    out_spatial = [
        (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(spatial)
    ]
    outputs = x[0] * w[0] * _prod(out_spatial)
    flops = 2.0 * outputs * (x[1] // groups) * _prod(w[2:])
    operands = [x, w] + ([shapes[2]] if len(shapes) > 2 and shapes[2] else [])
    return flops, outputs, operands


def _attention_work(
    shapes: list[list[int]], concrete: Sequence[Any] | None
) -> tuple[float, int, list[list[int]]]:
    q, k, v = shapes[0], shapes[1], shapes[2]
    batch_heads = _prod(q[:-2])
    s_q, s_k, d = q[-2], k[-2], q[-1]
    causal = False
    if concrete:
        for value in concrete[3:6]:
            if str(value).strip().lower() == "true":
                causal = True
    flops = 4.0 * batch_heads * s_q * s_k * d / (2 if causal else 1)
    return flops, batch_heads * s_q * v[-1], [q, k, v]


def op_point(op: Any, *, default_dtype: str | None = None) -> RooflinePoint:
    """The roofline point of one op record; ValueError with the reason when it has none.

    Bytes are the minimum traffic: every operand read once and the output written once.
    """
    name = str(_field(op, "name") or "")
    shapes_raw = _field(op, "input_shapes", "Input Dims", "shapes")
    if not shapes_raw:
        raise ValueError("no input shapes recorded (profile with record_shapes=True)")
    shapes = [list(s) if isinstance(s, (list, tuple)) else [] for s in shapes_raw]
    duration_us = _field(op, "duration_us", "dur", "duration")
    if duration_us is None or float(duration_us) <= 0:
        raise ValueError("no duration")
    types = _field(op, "input_types", "Input type", "dtypes") or []
    concrete = _field(op, "concrete_inputs", "Concrete Inputs")
    # A record may know the dtype the work ran in better than its input types (autocast,
    # fp32 matmuls that ran as TF32): ``compute_dtype`` then wins.
    dtype = _field(op, "compute_dtype") or dtype_of(types, default_dtype)
    if is_matmul(name):
        flops, outputs, operands = _matmul_work(name, shapes)
    elif name in CONV_OPS:
        flops, outputs, operands = _conv_work(shapes, concrete)
    elif name in ATTENTION_OPS:
        flops, outputs, operands = _attention_work(shapes, concrete)
    else:
        raise ValueError("no FLOP formula for this op")
    elem = DTYPE_BYTES.get("fp32" if dtype == "tf32" else dtype or "fp32", 4)
    traffic = (sum(_prod(s) for s in operands if s) + outputs) * elem
    return RooflinePoint(name, flops, float(traffic), float(duration_us) * 1e-6, dtype, "trace")


def points_from_ops(
    ops: Iterable[Any], *, default_dtype: str | None = None
) -> tuple[list[RooflinePoint], list[tuple[str, str]]]:
    """Roofline points from op records (``OpRecord``-like objects, mappings or Kineto ``cpu_op``
    events) whose FLOPs and bytes follow from their input shapes: matmul/linear/bmm,
    convolutions (when stride/padding were recorded as concrete inputs) and attention.

    Returns (points, skipped) where skipped lists (name, reason) for matmul-, conv- and
    attention-like ops that could not be costed; other ops are ignored silently.
    """
    candidates = [op for op in ops if is_costed(str(_field(op, "name") or ""))]
    points: list[RooflinePoint] = []
    skipped: list[tuple[str, str]] = []
    for op in _outermost(candidates):
        name = str(_field(op, "name") or "")
        try:
            points.append(op_point(op, default_dtype=default_dtype))
        except (ValueError, TypeError, IndexError, SyntaxError) as exc:
            skipped.append((name, str(exc) or type(exc).__name__))
    return points, skipped


def _outermost(ops: list[Any]) -> list[Any]:
    """Drop ops nested inside another costed op on the same thread (``aten::linear`` calls
    ``aten::addmm``: count the work once). Records without ``ts``/``dur`` are all kept."""
    timed: list[Any] = []
    untimed: list[Any] = []
    for op in ops:
        ts, dur = _field(op, "ts"), _field(op, "dur", "duration_us")
        (timed if ts is not None and dur is not None else untimed).append(op)
    timed.sort(
        key=lambda o: (
            str(_field(o, "tid")),
            float(_field(o, "ts")),
            -float(_field(o, "dur", "duration_us")),
        )
    )
    kept: list[Any] = []
    open_until: dict[str, float] = {}
    for op in timed:
        tid, ts = str(_field(op, "tid")), float(_field(op, "ts"))
        if ts < open_until.get(tid, -math.inf):
            continue
        open_until[tid] = ts + float(_field(op, "dur", "duration_us"))
        kept.append(op)
    return kept + untimed


# --- ceilings ----------------------------------------------------------------------------------


def _spec_of(system: GpuSource, gpu_index: int) -> tuple[Any | None, str]:
    """(GpuSpec-like, device name) from a SystemReport, a GpuSpec or a GPU name."""
    if system is None:
        return None, ""
    if hasattr(system, "peak_tflops_for"):
        return system, str(getattr(system, "name", "GPU"))
    if isinstance(system, str):
        name = system
    else:
        gpus = tuple(getattr(system, "gpus", ()) or ())
        if not gpus:
            return None, ""
        if gpu_index >= len(gpus):
            raise GpuDiagError(f"GPU {gpu_index} asked for; the report has {len(gpus)}.")
        name = str(gpus[gpu_index].name)
    from gpudiag import specs

    return specs.lookup_gpu(name), name  # None for an unknown board: roofs from measurements


def roofline(
    system: GpuSource = None,
    points: Iterable[Any] = (),
    *,
    measured: Iterable[Any] = (),
    ops: Iterable[Any] = (),
    dtype: str | None = None,
    gpu_index: int = 0,
    dtypes: Sequence[str] = ("fp32", "tf32", "bf16", "fp16", "fp8"),
) -> Roofline:
    """Build a roofline.

    ``system``: a SystemReport (``gd.inspect()``), a GpuSpec, a GPU name, or None. ``points``:
    RooflinePoint, ``(name, flops, bytes, seconds[, dtype])`` tuples, mappings, or ``gd.bench``
    matmul/attention results (their rows become points). ``measured``: ``gd.bench.matmul()`` and
    ``gd.bench.bandwidth()`` results, whose best numbers become "measured" roofs (a matmul
    result's own peaks, e.g. a labelled CPU estimate, are used too). ``dtype`` picks the roof for
    the ridge and for points without a dtype. ``ops``: profiler op records (see
    ``points_from_ops``); those that cannot be costed are listed in ``skipped``.
    """
    ceilings: list[Ceiling] = []
    notes: list[str] = []
    spec, device = _spec_of(system, gpu_index)
    if spec is not None:
        for d in dtypes:
            value = spec.peak_tflops_for(d)
            if value:
                ceilings.append(
                    Ceiling("compute", float(value), "specs", d, f"spec table: {device}")
                )
        bandwidth = getattr(spec, "memory_bandwidth_gbps", None)
        if bandwidth:
            ceilings.append(
                Ceiling("memory", float(bandwidth), "specs", None, f"spec table: {device}")
            )
    elif system is not None:
        what = f"no spec-table entry for {device}" if device else "no GPU in the system report"
        notes.append(f"{what}: roofs come from measurements only")
    bench_points: list[RooflinePoint] = []
    for result in measured:
        device = device or str(getattr(result, "device", ""))
        if hasattr(result, "tflops") and hasattr(result, "dtypes"):
            for d in result.dtypes:
                best = result.tflops(d)
                if best:
                    ceilings.append(
                        Ceiling(
                            "compute",
                            float(best),
                            "measured",
                            d,
                            f"gd.bench.matmul on {result.device}",
                        )
                    )
                peak = getattr(result, "peaks", {}).get(d)
                if (
                    peak is not None
                    and peak.ok
                    and not any(c.origin == "specs" and c.dtype == d for c in ceilings)
                ):
                    origin = "estimate" if str(peak.source).startswith("estimate") else "specs"
                    ceilings.append(
                        Ceiling("compute", float(peak.value), origin, d, str(peak.source))
                    )
        elif hasattr(result, "gbps"):
            best = result.gbps("copy") if "copy" in getattr(result, "kinds", ("copy",)) else None
            if best:
                ceilings.append(
                    Ceiling(
                        "memory",
                        float(best),
                        "measured",
                        None,
                        f"gd.bench.bandwidth copy (read + write) on {result.device}",
                    )
                )
        else:
            raise GpuDiagError(
                "measured= takes gd.bench.matmul() / gd.bench.bandwidth() results, got "
                f"{type(result).__name__}."
            )
    for item in points:
        if hasattr(item, "rows") and not isinstance(item, (tuple, list, Mapping)):
            bench_points.extend(points_from_benchmark(item))
        else:
            bench_points.append(as_point(item))
    op_points, skipped = points_from_ops(ops)
    bench_points.extend(op_points)
    if dtype is None:
        compute_dtypes = [c.dtype for c in ceilings if c.kind == "compute"]
        point_dtypes = [p.dtype for p in bench_points if p.dtype]
        for candidate in (*point_dtypes, "bf16", "fp32", *compute_dtypes):
            if candidate in compute_dtypes:
                dtype = candidate
                break
    if not ceilings:
        notes.append(
            "no roofs: pass system=gd.inspect() on a GPU, or "
            "measured=[gd.bench.matmul(), gd.bench.bandwidth()]"
        )
    return Roofline(
        device or "unknown device",
        tuple(ceilings),
        tuple(bench_points),
        tuple(skipped),
        dtype,
        tuple(notes),
    )
