"""Matmul ceiling: achieved TFLOP/s per dtype against the spec peak and the best measured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._progress import ProgressFn, iterate, resolve
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Grid, Lines
from gpudiag.analysis.measurement import noise_warning
from gpudiag.bench import _env
from gpudiag.bench.timing import Measurement, Rotation, copies_to_exceed_cache, measure
from gpudiag.errors import GpuDiagError
from gpudiag.probe.readings import Reading

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# Relative Frobenius error allowed against a float64 product of the same (rounded) inputs: the
# output rounding of the dtype plus accumulation error over K, with headroom.
TOLERANCE: Mapping[str, float] = {
    "fp32": 1e-4,
    "tf32": 5e-3,
    "bf16": 2e-2,
    "fp16": 5e-3,
    "fp8": 2e-2,  # inputs are already fp8; the product is kept in bf16
}
_CHECK_ROWS = 64
_CPU_SIZES = (512, 1024, 2048)
_GPU_SIZES = (2048, 4096, 8192)


@dataclass(frozen=True, slots=True)
class MatmulRow:
    """One (dtype, shape) case. ``tflops`` is at the median time; None when it could not run."""

    dtype: str
    m: int
    n: int
    k: int
    measurement: Measurement | None
    tflops: float | None
    tflops_iqr: tuple[float, float] | None = None  # TFLOP/s at the Q3 and Q1 times
    max_rel_error: float | None = None
    correct: bool = False
    reason: str = ""  # why it could not run, or why the result was rejected

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "dtype": self.dtype,
                "m": self.m,
                "n": self.n,
                "k": self.k,
                "flops": self.flops,
                "tflops": self.tflops,
                "tflops_iqr": self.tflops_iqr,
                "max_rel_error": self.max_rel_error,
                "correct": self.correct,
                "reason": self.reason,
                "measurement": self.measurement,
            }
        )


@dataclass(frozen=True, slots=True)
class MatmulResult(Carded):
    """``gd.bench.matmul()``: achieved TFLOP/s per dtype and size, peaks, and what could not run.

    ``tflops(dtype)`` is the best correct median over the sizes, or None when the dtype was asked
    for but could not run here (``reason(dtype)`` says why). Asking for a dtype that was not part
    of the run is a GpuDiagError.
    """

    device: str
    rows: tuple[MatmulRow, ...]
    peaks: Mapping[str, Reading[float]] = field(default_factory=dict)
    unavailable: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def dtypes(self) -> tuple[str, ...]:
        seen = [r.dtype for r in self.rows] + list(self.unavailable)
        return tuple(dict.fromkeys(seen))

    def _check(self, dtype: str) -> str:
        key = _env.normalize_dtype(dtype)
        if key not in self.dtypes:
            raise GpuDiagError(
                f"{key} was not measured in this run "
                f"(measured: {', '.join(self.dtypes) or 'none'}); "
                f"run gd.bench.matmul(dtypes=[{key!r}])."
            )
        return key

    def best(self, dtype: str) -> MatmulRow | None:
        key = self._check(dtype)
        rows = [r for r in self.rows if r.dtype == key and r.correct and r.tflops is not None]
        return max(rows, key=lambda r: r.tflops or 0.0) if rows else None

    def tflops(self, dtype: str) -> float | None:
        """Best achieved TFLOP/s for ``dtype`` over the sizes; None when it could not run."""
        row = self.best(dtype)
        return None if row is None else row.tflops

    def reason(self, dtype: str) -> str:
        """Why ``dtype`` has no number ('' when it has one)."""
        key = self._check(dtype)
        if key in self.unavailable:
            return self.unavailable[key]
        if self.best(key) is not None:
            return ""
        reasons = {r.reason for r in self.rows if r.dtype == key and r.reason}
        return "; ".join(sorted(reasons)) or "no correct result"

    def peak_tflops(self, dtype: str) -> float | None:
        reading = self.peaks.get(self._check(dtype))
        return reading.value if reading is not None and reading.ok else None

    def fraction_of_peak(self, dtype: str) -> float | None:
        achieved, peak = self.tflops(dtype), self.peak_tflops(dtype)
        return achieved / peak if achieved is not None and peak else None

    def fraction_of_best(self, row: MatmulRow) -> float | None:
        best = self.tflops(row.dtype)
        return row.tflops / best if row.tflops is not None and best else None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "matmul",
                "device": self.device,
                "best_tflops": {d: self.tflops(d) for d in self.dtypes},
                "peaks": self.peaks,
                "unavailable": self.unavailable,
                "rows": self.rows,
                "notes": self.notes,
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def summary_rows(self) -> list[tuple[str, str, str, str]]:
        out = []
        for dtype in self.dtypes:
            best = self.tflops(dtype)
            peak = self.peaks.get(dtype)
            frac = self.fraction_of_peak(dtype)
            out.append(
                (
                    dtype,
                    f"{best:.2f}" if best is not None else f"N/A ({self.reason(dtype)})",
                    peak.display("TFLOP/s", "{:.1f}") if peak is not None else "N/A",
                    f"{frac:.0%}" if frac is not None else "",
                )
            )
        return out

    def __repr__(self) -> str:
        lines = [f"MatmulResult on {self.device}: best TFLOP/s per dtype"]
        for dtype, best, peak, frac in self.summary_rows():
            lines.append(
                f"  {dtype:<5} {best:>10}  peak {peak}{'  (' + frac + ')' if frac else ''}"
            )
        for reading in self.peaks.values():
            if reading.ok and reading.source.startswith("estimate"):
                lines.append(f"  peak {reading.source}")
                break
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        summary = Grid(("dtype", "best TFLOP/s", "peak", "of peak"), self.summary_rows())
        detail = Grid(
            ("dtype", "M x N x K", "TFLOP/s (median)", "IQR", "of best", "check"),
            [
                (
                    r.dtype,
                    r.shape,
                    f"{r.tflops:.2f}" if r.tflops is not None else "N/A",
                    f"{r.tflops_iqr[0]:.2f} - {r.tflops_iqr[1]:.2f}" if r.tflops_iqr else "",
                    f"{f:.0%}" if (f := self.fraction_of_best(r)) is not None else "",
                    "ok" if r.correct else r.reason,
                )
                for r in self.rows
            ],
        )
        peaks = [f"{d} peak: {p.source or p.reason}" for d, p in self.peaks.items()]
        return Card(
            "Matmul ceiling",
            [summary, detail, Lines(peaks, "note"), Lines(self.notes, "note")],
            subtitle=self.device,
        )


def _shapes(sizes: Iterable[int | Sequence[int]]) -> list[tuple[int, int, int]]:
    if isinstance(sizes, (int, float, str)):
        raise GpuDiagError(f"matmul sizes is a list (sizes=[2048] or [(M, N, K)]), got {sizes!r}")
    out: list[tuple[int, int, int]] = []
    for size in sizes:
        shape: tuple[int, ...]
        if isinstance(size, (int, float, str)):
            (n,) = _env.whole_numbers([size], "a matmul size", high=1 << 24)
            shape = (n, n, n)
        else:
            shape = tuple(_env.whole_numbers(size, "a matmul dimension", high=1 << 24))
        if len(shape) != 3 or min(shape) < 1:
            raise GpuDiagError(f"Matmul size {size!r}: give an int N (N x N x N) or (M, N, K).")
        out.append((shape[0], shape[1], shape[2]))
    if not out:
        raise GpuDiagError("No matmul sizes given.")
    return out


def default_dtypes(target: _env.Target, system: SystemReport | None = None) -> tuple[str, ...]:
    """The dtypes worth measuring on this device: those with a fast path."""
    if target.is_cuda:
        return tuple(d for d in _env.DTYPES if _env.gpu_supports(target, d)[0])
    flags = set(_env.cpu_flags(system))
    out = ["fp32"]
    if flags & {"avx512_bf16", "amx_bf16"}:
        out.append("bf16")
    if flags & {"avx512_fp16", "amx_fp16"}:
        out.append("fp16")
    return tuple(out)


def _unavailable_reason(target: _env.Target, dtype: str) -> str:
    if target.is_cuda:
        supported, reason = _env.gpu_supports(target, dtype)
        return "" if supported else reason
    if dtype == "tf32":
        return "TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and later); no CPU has it"
    return ""


@contextlib.contextmanager
def _matmul_precision(dtype: str) -> Iterator[None]:
    """fp32 means full fp32 even if the user enabled TF32; tf32 turns it on. Restored after."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.float8_e4m3fn,
    }[dtype]


def _operands(
    shape: tuple[int, int, int], dtype: str, device: str, generator: Any
) -> tuple[Any, Any, Any]:
    """(A, B, out) filled with normal random values (never zeros: they multiply faster)."""
    import torch

    m, n, k = shape
    a = torch.randn(m, k, generator=generator, device=device)
    b = torch.randn(n, k, generator=generator, device=device)
    if dtype == "fp8":
        # _scaled_mm wants B column-major: B is stored as N x K and used transposed.
        return a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t(), None
    tdtype = _torch_dtype(dtype)
    return (
        a.to(tdtype),
        b.t().contiguous().to(tdtype),
        torch.empty(m, n, dtype=tdtype, device=device),
    )


def _run_op(dtype: str, device: str) -> Any:
    import torch

    if dtype == "fp8":
        one = torch.ones((), device=device)

        def fp8(ops: tuple[Any, Any, Any]) -> Any:
            return torch._scaled_mm(
                ops[0], ops[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            )

        return fp8

    def mm(ops: tuple[Any, Any, Any]) -> Any:
        return torch.mm(ops[0], ops[1], out=ops[2])

    return mm


def check_product(a: Any, b: Any, product: Any, rows: int = _CHECK_ROWS) -> float:
    """Relative Frobenius error of ``product`` on a sample of rows, against float64."""
    import torch

    m = a.shape[0]
    index = torch.linspace(0, m - 1, min(rows, m), device=a.device).round().long()
    reference = a[index].double() @ b.double()
    got = product[index].double()
    denom = torch.linalg.vector_norm(reference)
    return (
        float(torch.linalg.vector_norm(got - reference) / denom)
        if float(denom) > 0
        else float("inf")
    )


def _memory_budget_bytes(target: _env.Target) -> int:
    if target.is_cuda:
        from gpudiag.probe import cuda

        free = cuda.mem_get_info(target.index)
        return max(free[0] // 4, 256 << 20) if free else 1 << 30
    return 512 << 20


def matmul(
    dtypes: Iterable[str] | None = None,
    sizes: Iterable[int | Sequence[int]] | None = None,
    *,
    device: str | int | None = None,
    repeats: int | None = None,
    warmup: int = 2,
    max_time_s: float | None = None,
    system: SystemReport | None = None,
    progress: bool | ProgressFn = True,
    seed: int = 0,
) -> MatmulResult:
    """Measure matmul throughput per dtype and size; the best per dtype is its ceiling.

    Each case multiplies normal random matrices (A @ B, 2*M*N*K FLOPs), rotating copies whose
    total is twice the last-level cache, times them with CUDA events (or the host clock on a
    CPU) after ``warmup`` untimed calls, and keeps the median and IQR of ``repeats``
    repetitions. A sample of output rows is checked against float64; a wrong result gets no
    TFLOP/s. On a CPU the peak is an estimate from the clock and vector extensions (labelled
    as such); on a GPU it comes from the spec table. fp8 uses ``torch._scaled_mm`` (e4m3,
    unit scales, bf16 output). GPU paths are untested on a real GPU in this version.
    """
    import torch

    target = _env.resolve_device(device)
    asked = tuple(_env.normalize_dtype(d) for d in dtypes) if dtypes is not None else None
    chosen = asked if asked is not None else default_dtypes(target, system)
    shapes = _shapes(sizes if sizes is not None else (_GPU_SIZES if target.is_cuda else _CPU_SIZES))
    repeats = repeats if repeats is not None else (30 if target.is_cuda else 10)
    max_time_s = max_time_s if max_time_s is not None else (2.0 if target.is_cuda else 5.0)
    cache_bytes, _ = _env.last_level_cache_bytes(target, system)
    budget = _memory_budget_bytes(target)
    timer = _env.timer_for(target)
    notes: list[str] = []
    if asked is None and not target.is_cuda:
        skipped = [d for d in ("fp16", "fp8") if d not in chosen]
        if skipped:
            notes.append(
                f"{', '.join(skipped)} not measured by default: no hardware path on this CPU "
                "(torch falls back to slow reference kernels); ask for them with dtypes=[...]"
            )
    if target.is_cuda:
        notes.append("GPU path: untested on a real GPU in this version of gpudiag")

    unavailable: dict[str, str] = {}
    rows: list[MatmulRow] = []
    generator = torch.Generator(device=target.torch_device).manual_seed(seed)
    cases = [(d, s) for d in chosen for s in shapes]
    for dtype, shape in iterate(cases, "matmul", resolve(progress, "bench")):
        if dtype in unavailable:
            continue
        reason = _unavailable_reason(target, dtype)
        if reason:
            unavailable[dtype] = reason
            continue
        rows.append(
            _one_case(
                target,
                dtype,
                shape,
                generator,
                cache_bytes,
                budget,
                timer,
                repeats=repeats,
                warmup=warmup,
                max_time_s=max_time_s,
            )
        )
    peaks = {d: _env.peak_tflops(target, d, system) for d in chosen}
    swung = noise_warning([(f"{r.dtype} {r.shape}", r.measurement) for r in rows])
    notes += [swung] if swung else []
    return MatmulResult(target.label, tuple(rows), peaks, unavailable, tuple(notes))


def _one_case(
    target: _env.Target,
    dtype: str,
    shape: tuple[int, int, int],
    generator: Any,
    cache_bytes: int,
    budget: int,
    timer: Any,
    *,
    repeats: int,
    warmup: int,
    max_time_s: float,
) -> MatmulRow:
    m, n, k = shape
    elem = 1 if dtype == "fp8" else (4 if dtype in {"fp32", "tf32"} else 2)
    per_copy = (m * k + k * n) * elem + m * n * (2 if dtype == "fp8" else elem)
    copies = copies_to_exceed_cache(per_copy, cache_bytes, max_total_bytes=budget)
    # randn makes fp32 A and B first, then converts them: count those too.
    refused = _env.too_big(target, copies * per_copy + (m * k + k * n) * 4)
    if refused:
        return MatmulRow(dtype, m, n, k, None, None, reason=refused)
    try:
        operands = [_operands(shape, dtype, target.torch_device, generator) for _ in range(copies)]
        op = _run_op(dtype, target.torch_device)
        rotation = Rotation(operands)
        with _matmul_precision(dtype):
            measurement = measure(
                lambda: op(rotation.next()),
                repeats=repeats,
                warmup=warmup,
                max_time_s=max_time_s,
                timer=timer,
                label=f"{dtype} {m}x{n}x{k}",
            )
            first = operands[0]
            product = op(first)
            error = check_product(first[0], first[1], product)
    except (RuntimeError, TypeError, NotImplementedError, MemoryError) as exc:
        from gpudiag.probe import cuda

        what = "out of memory" if cuda.is_oom_error(exc) else "cannot run"
        return MatmulRow(dtype, m, n, k, None, None, reason=f"{what}: {_first_line(exc)}")
    flops = 2 * m * n * k
    correct = error <= TOLERANCE[dtype]
    q3_rate, q1_rate = measurement.rate_spread(flops)
    return MatmulRow(
        dtype,
        m,
        n,
        k,
        measurement,
        measurement.rate(flops) / 1e12 if correct else None,
        (q3_rate / 1e12, q1_rate / 1e12) if correct else None,
        error,
        correct,
        "" if correct else f"wrong result: relative error {error:.2e} > {TOLERANCE[dtype]:.0e}",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
