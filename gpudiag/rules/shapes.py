"""Shape rules: matrix dimensions that keep the hot GEMMs off full-speed tensor-core tiles."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.analysis.costed_ops import DTYPE_BYTES, is_matmul
from gpudiag.analysis.trace.ledger import GEMM_TENSOR_CORES
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import span_us, trace_device, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, NotEvaluated, Severity, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "shapes"
RULE = "shapes.gemm_alignment"

# NVIDIA Deep Learning Performance docs, "Matrix Multiplication Background User's Guide"
# (Tensor Core Requirements) and "Optimizing Linear/Fully-Connected Layers User's Guide":
# tensor cores are used most efficiently when M, N and K are multiples of 16 bytes (fp16/bf16:
# 8 elements, TF32: 4, int8: 16), and on A100 multiples of 128 bytes (64 fp16 elements) work
# best.
ALIGN_BYTES = 16
BEST_BYTES = 128
# Suggest the 128-byte multiple when it adds at most this much work, else the 16-byte one
# (a vocabulary of 50257 -> 50304 adds 0.1 %; a dimension of 647 -> 672 would add 4 %).
PAD_TO_BEST_MAX = 0.02
# A GEMM shape under 0.1 % of GPU compute-kernel time is a crumb, not worth a model change;
# the rule reports when the unaligned shapes above it add up to >= 3 % of that time.
HOT_SHARE = 0.001
MIN_SHARE = 0.03
# How much padding saves depends on the library version and the shape; a quarter of the
# unaligned GEMMs' time is a deliberately conservative estimate.
_PADDING_SAVING = 0.25
_PADDING_SOURCE = (
    "a conservative estimate: NVIDIA's Matrix Multiplication Background guide shows 2-4x "
    "slower GEMMs for sizes off the 16-byte multiple; how much depends on the library"
)
_TOP = 3


def _elements(nbytes: int, dtype: str) -> int:
    return max(nbytes // DTYPE_BYTES[dtype], 1)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded(value: int, dtype: str) -> int:
    """The size to pad ``value`` to: the next 128-byte multiple when that is cheap, else the
    next 16-byte multiple."""
    best = _round_up(value, _elements(BEST_BYTES, dtype))
    if best - value <= PAD_TO_BEST_MAX * value:
        return best
    return _round_up(value, _elements(ALIGN_BYTES, dtype))


@dataclass(frozen=True)
class _Unaligned:
    """One hot GEMM shape with the dimensions that break the alignment."""

    shape: Any  # gpudiag.analysis.trace.shapes.GemmShape
    share: float  # of GPU compute-kernel time
    dims: tuple[tuple[str, int, int], ...]  # (M/N/K, value, padded value)

    @property
    def label(self) -> str:
        d = self.shape.dims
        batch = f" x{d.batch}" if d.batch > 1 else ""
        return f"{self.shape.name} [{self.shape.dtype}] M={d.m} N={d.n} K={d.k}{batch}"

    @property
    def data_rows(self) -> list[tuple[str, int, int]]:
        """The unaligned M when it is the rows of the activations (set by the batch size)."""
        return [t for t in self.dims if t[0] == "M" and self.shape.dims.m_from_batch]

    @property
    def layer_dims(self) -> list[tuple[str, int, int]]:
        return [t for t in self.dims if t not in self.data_rows]


def _tensor_core_dtypes(cc: tuple[int, int]) -> dict[str, str] | None:
    """dtype -> how its tensor cores are named, on this GPU (None: unknown GPU)."""
    from gpudiag.errors import GpuDiagError
    from gpudiag.specs import features

    try:
        feats = features(cc)
    except GpuDiagError:
        return None
    # fp32 GEMMs reach tensor cores as TF32, when torch allows it.
    spec_name = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "fp8": "fp8", "fp32": "tf32"}
    return {
        d: ("TF32" if d == "fp32" else d) for d, name in spec_name.items() if feats.supports(name)
    }


def _unaligned(shape: Any, share: float, on_tensor_cores: dict[str, str]) -> _Unaligned | None:
    dtype = shape.dtype
    if dtype not in on_tensor_cores:
        return None
    # fp32 GEMMs that did not run on tensor cores belong to precision.tensor_cores.
    if dtype == "fp32" and not (shape.tensor_core_us or 0.0) > 0:
        return None
    align = _elements(ALIGN_BYTES, dtype)
    d = shape.dims
    # A dimension below the alignment is a matrix-vector-like product: padding it multiplies
    # the work instead of fixing the tiles.
    off = tuple(
        (axis, value, padded(value, dtype))
        for axis, value in (("M", d.m), ("N", d.n), ("K", d.k))
        if value >= align and value % align
    )
    return _Unaligned(shape, share, off) if off else None


def _requirement(dtypes: list[str], on_tensor_cores: dict[str, str]) -> str:
    return ", ".join(
        f"{_elements(ALIGN_BYTES, d)} {on_tensor_cores[d]} elements" for d in dict.fromkeys(dtypes)
    )


def _compute_us(trace: TraceReport) -> float:
    return sum(r.tensor_cores.compute_us for r in trace.ranks if r.tensor_cores is not None)


def _dims_text(dims: list[tuple[str, int, int]]) -> str:
    return ", ".join(f"{axis} {value} -> {pad}" for axis, value, pad in dims)


@rule(RULE, category=CATEGORY, needs=("gpu_trace",))
def gemm_alignment(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Hot GEMMs whose M, N or K is not a multiple of 16 bytes run below tensor-core speed."""
    trace = evidence.trace_report
    cc, name = trace_device(evidence)
    if cc is None:
        yield NotEvaluated(RULE, "the GPU's compute capability")
        return
    if cc < (7, 0):
        return  # no tensor cores
    on_tensor_cores = _tensor_core_dtypes(cc)
    if on_tensor_cores is None:
        yield NotEvaluated(RULE, f"the tensor-core dtypes of cc {cc[0]}.{cc[1]}")
        return
    matmuls = [op for op in trace.shaped_ops() if is_matmul(op.name)]
    if not matmuls:
        return
    shapes = trace.gemm_shapes()
    if not shapes:
        yield NotEvaluated(RULE, "operator input shapes (profile with record_shapes=True)")
        return
    if all(s.gpu_us is None for s in shapes):
        yield NotEvaluated(RULE, "kernels tied to their operators (External id in the trace)")
        return
    compute_us = _compute_us(trace)
    if compute_us <= 0:
        return
    # Attention's products (Q K^T, P V) have the sequence length and head size as sizes: the
    # fix there is a fused attention backend (attention.eager), not padding the data.
    unaligned = [
        u
        for s in shapes
        if not s.in_attention
        and (s.gpu_us or 0.0) >= HOT_SHARE * compute_us
        and (u := _unaligned(s, (s.gpu_us or 0.0) / compute_us, on_tensor_cores)) is not None
    ]
    # Rows of the activations (batch x sequence) are not the model's to pad: tokens of an
    # inference request, a vision transformer's 197 patches. Only the model's own sizes
    # (hidden, vocabulary, heads) make the claim; a GEMM unaligned only in its data rows is
    # mentioned, never scored.
    hot = [u for u in unaligned if u.layer_dims]
    if sum(u.share for u in hot) < MIN_SHARE:
        return
    data_only = [u for u in unaligned if not u.layer_dims]
    yield _finding(trace, hot, data_only, compute_us, cc, name, on_tensor_cores)


def _finding(
    trace: TraceReport,
    hot: list[_Unaligned],
    data_only: list[_Unaligned],
    compute_us: float,
    cc: tuple[int, int],
    gpu: str,
    on_tensor_cores: dict[str, str],
) -> Finding:
    src = trace_source(trace)
    share = sum(u.share for u in hot)
    hot.sort(key=lambda u: -u.share)
    dtypes = [u.shape.dtype for u in hot]
    requirement = _requirement(dtypes, on_tensor_cores)
    items = [
        Evidence("unaligned hot GEMM time", round(100 * share, 1), "% of GPU compute", src),
        Evidence("GPU", f"{gpu} (cc {cc[0]}.{cc[1]})", source=src),
    ]
    for u in hot[:_TOP]:
        items.append(Evidence(u.label, round(100 * u.share, 1), "% of GPU compute", src))
        items.append(Evidence(f"{u.shape.name} unaligned", _dims_text(list(u.dims)), source=src))
    layer = list(dict.fromkeys((value, pad) for u in hot for _, value, pad in u.layer_dims))
    rows = {
        v: _elements(ALIGN_BYTES, u.shape.dtype)
        for u in [*hot, *data_only]
        for _, v, _ in u.data_rows
    }
    if rows:
        items.append(
            Evidence(
                "unaligned rows from the data (batch x sequence; not scored)",
                ", ".join(map(str, rows)),
                source=src,
            )
        )
    steps: list[str] = []
    if layer:
        steps.append(
            "pad the model's sizes (vocabulary, hidden or feature sizes): "
            f"{', '.join(f'{v} -> {p}' for v, p in layer[:_TOP])}; padded output rows can be "
            "ignored or masked"
        )
    if rows:
        steps.append(
            f"the rows M = {', '.join(map(str, rows))} are batch x sequence from the data "
            "(not scored: tokens of a request or a model's fixed patch count are not yours to "
            f"pad); only where you set the batch, a multiple of {max(rows.values())} aligns "
            "them"
        )
    span = span_us(trace)
    top = hot[0]
    claimed = share * compute_us
    found = claim(trace, (GEMM_TENSOR_CORES + ".",), _PADDING_SAVING, _PADDING_SOURCE, claimed)
    if found is not None:
        gain: float | None = found.gain
        items += found.evidence(src)
    else:
        gain = claimed * _PADDING_SAVING / span if span else None
    return Finding(
        RULE,
        severity_for_gain(gain) if gain is not None else Severity.LOW,
        CATEGORY,
        f"{share:.0%} of GPU compute time is in GEMMs with a model size that is not a multiple of "
        f"{requirement} ({top.shape.name} {_dims_text(top.layer_dims[:2])}): tensor cores run "
        "them below full speed",
        tuple(items),
        threshold=(
            f"cc >= 7.0; a GEMM's M, N or K not a multiple of {ALIGN_BYTES} bytes (8 fp16/bf16, "
            f"16 int8/fp8, 4 TF32 elements) in shapes of >= {HOT_SHARE:.1%} of GPU compute, "
            f">= {MIN_SHARE:.0%} together, counting only the model's sizes (an M that is the "
            "data's batch x sequence is not scored); attention's Q K^T and P V products left "
            "out (their sizes are the sequence length and head size)"
        ),
        instruction="; ".join(steps),
        estimated_gain=gain,
        claims=(GEMM_TENSOR_CORES,) if found is not None else (),
    )
