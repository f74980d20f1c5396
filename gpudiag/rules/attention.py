"""Attention rules: hand-written (eager) attention, and SDPA falling back to its math path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.ledger import (
    ATTENTION_EAGER,
    GEMM_CUDA_CORES,
    GEMM_TENSOR_CORES,
    GEMM_UNKNOWN_UNITS,
    MEMORY_BOUND_WORK,
)
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import span_us, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "attention"

EAGER_SHARE = 0.05  # of the run: hand-written attention worth replacing
MATH_SHARE = 0.05  # of step time (of the outermost operator's time without steps)
# A fused kernel at least halves attention time: conservative next to what gd.compare measured
# on a 2-core CPU for a small GPT at sequence 1024 (SDPA flash vs math-path attention: the
# whole step 2.96-3.12x faster; benchmarks/compare_demo.py).
_FUSED_SAVING = 0.5

_FUSED_SOURCE = (
    "a conservative estimate: gd.compare measured SDPA flash vs math-path attention on a "
    "small GPT at sequence 1024 at 2.96-3.12x for the whole step (benchmarks/compare_demo.py)"
)
# Where eager attention's time lies in the ledger: its own row (the forward and the softmax
# backward), and the GEMM rows that hold its products' backward.
_ATTENTION_ROWS = (
    ATTENTION_EAGER,
    GEMM_TENSOR_CORES + ".",
    GEMM_CUDA_CORES,
    GEMM_UNKNOWN_UNITS,
    MEMORY_BOUND_WORK,
)

_MATH_OP = "aten::_scaled_dot_product_attention_math"


@rule("attention.sdpa_math", category=CATEGORY, needs=("trace",))
def sdpa_math_fallback(evidence: EvidenceBundle) -> Iterator[Finding]:
    """SDPA runs its math backend (the seq x seq matrix in memory), not a fused kernel."""
    trace = evidence.trace_report
    ops = trace.top_cpu_ops(10_000)
    math = [o for o in ops if o.name == _MATH_OP]
    if not math:
        return
    steps = [s.duration_us for s in trace.steps() if s.in_window]
    window = sum(steps) if steps else (ops[0].total_us if ops else 0.0)
    share = math[0].total_us / window if window > 0 else 0.0
    use = trace.attention()
    if use.math_calls and use.timed_on == "gpu" and span_us(trace):
        # On a GPU trace the operator's host time is launch time: its kernels tell the cost.
        share = use.math_us / (span_us(trace) or 1.0)
    if share < MATH_SHARE:
        return
    src = trace_source(trace)
    gain = share * _FUSED_SAVING
    found = None
    if use.math_calls and use.timed_on == "gpu":
        found = claim(trace, _ATTENTION_ROWS[1:], _FUSED_SAVING, _FUSED_SOURCE, use.math_us)
        gain = found.gain if found is not None else gain
    yield Finding(
        "attention.sdpa_math_fallback",
        severity_for_gain(gain),
        CATEGORY,
        f"scaled_dot_product_attention runs its math backend ({math[0].count} calls): no fused "
        "kernel was chosen (dtype, mask, head size or dropout ruled them out)",
        (
            Evidence(
                _MATH_OP, round(math[0].total_us / 1e3, 2), f"ms in {math[0].count} calls", src
            ),
            Evidence("share of step time", round(100 * share, 1), "%", src),
            *(found.evidence(src) if found is not None else ()),
        ),
        threshold=f"{_MATH_OP} >= {MATH_SHARE:.0%} of step time",
        fix=FixRef("attention.backend", {"backend": "flash"}),
        instruction="force a backend with torch.nn.attention.sdpa_kernel to see why it is "
        "refused (the warning names the reason); fp16/bf16 and head size <= 256 suit flash",
        estimated_gain=gain,
        claims=tuple(r.rstrip(".") for r in _ATTENTION_ROWS[1:]) if found is not None else (),
    )


def _run_us(trace: TraceReport, timed_on: str) -> float:
    """The time a share of the run is taken of: the GPU span on a GPU trace; the steps (or
    the outermost operator) on a CPU-only one, where operators' own time is their work."""
    if timed_on == "gpu":
        return span_us(trace) or 0.0
    steps = [s.duration_us for s in trace.steps() if s.in_window]
    if steps:
        return float(sum(steps))
    ops = trace.top_cpu_ops(1)
    return float(ops[0].total_us) if ops else 0.0


@rule("attention.eager", category=CATEGORY, needs=("trace",))
def eager_attention(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Hand-written attention (matmul -> scale/mask -> softmax -> matmul) instead of a fused
    kernel, costed from the operator tree."""
    trace = evidence.trace_report
    use = trace.attention()
    if use.eager_calls == 0:
        return
    run = _run_us(trace, use.timed_on)
    if run <= 0:
        return
    share = use.eager_us / run
    if share < EAGER_SHARE:
        return
    gain = share * _FUSED_SAVING
    src = trace_source(trace)
    found = None
    if use.timed_on == "gpu":
        found = claim(trace, _ATTENTION_ROWS, _FUSED_SAVING, _FUSED_SOURCE, use.eager_us)
        gain = found.gain if found is not None else gain
    what = "kernel time" if use.timed_on == "gpu" else "operator time (CPU-only trace)"
    items = [
        Evidence("eager attention calls", use.eager_calls, "", src),
        Evidence("operators of one call", " -> ".join(use.pattern), "", src),
        Evidence("forward (QK^T through PV)", round(use.forward_us / 1e3, 2), f"ms {what}", src),
        Evidence("of it in softmax", round(use.softmax_us / 1e3, 2), "ms", src),
        Evidence(
            "backward",
            round(use.backward_us / 1e3, 2),
            "ms (softmax backward measured, the products' backward estimated as 2x forward)",
            src,
        ),
        Evidence("share of the run", round(100 * share, 1), "%", src),
        *(found.evidence(src) if found is not None else ()),
    ]
    if use.fused_calls:
        items.append(
            Evidence(
                "fused attention calls beside them",
                f"{use.fused_calls} ({', '.join(use.fused_backends)})",
                source=src,
            )
        )
    yield Finding(
        "attention.eager",
        severity_for_gain(gain),
        CATEGORY,
        f"hand-written attention (softmax between two matmuls, {use.eager_calls} calls) takes "
        f"{share:.0%} of the run, {use.softmax_us / max(use.forward_us, 1e-9):.0%} of its "
        "forward in softmax: a fused attention kernel never writes the seq x seq matrix",
        tuple(items),
        threshold=f"eager attention (forward + backward) >= {EAGER_SHARE:.0%} of the run",
        fix=FixRef("attention.backend", {"backend": "sdpa"}),
        instruction="call torch.nn.functional.scaled_dot_product_attention(q, k, v, "
        "attn_mask=..., dropout_p=...) instead of softmax(q @ k.transpose(-2, -1) * scale) @ v; "
        'a Hugging Face model: from_pretrained(..., attn_implementation="sdpa") (or '
        '"flash_attention_2" with flash-attn installed)',
        estimated_gain=gain,
        claims=tuple(r.rstrip(".") for r in _ATTENTION_ROWS) if found is not None else (),
    )
