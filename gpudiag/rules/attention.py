"""Attention rules: scaled_dot_product_attention falling back to its math path."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity

CATEGORY = "attention"

MATH_SHARE = 0.05  # of step time (of the outermost operator's time without steps)
# A fused kernel at least halves attention time: conservative next to what gd.compare measured
# on a 2-core CPU for a small GPT at sequence 1024 (SDPA flash vs math-path attention: the
# whole step 2.96-3.12x faster; benchmarks/compare_demo.py).
_FUSED_SAVING = 0.5

_MATH_OP = "aten::_scaled_dot_product_attention_math"


@rule("attention.sdpa_math", category=CATEGORY, needs=("trace",))
def sdpa_math_fallback(evidence: EvidenceBundle) -> Iterator[Finding]:
    """SDPA runs its math backend (the seq x seq matrix in memory), not a fused kernel."""
    trace = evidence.trace
    ops = trace.top_cpu_ops(10_000)
    math = [o for o in ops if o.name == _MATH_OP]
    if not math:
        return
    steps = [s.duration_us for s in trace.steps() if s.in_window]
    window = sum(steps) if steps else (ops[0].total_us if ops else 0.0)
    share = math[0].total_us / window if window > 0 else 0.0
    if share < MATH_SHARE:
        return
    src = trace_source(trace)
    yield Finding(
        "attention.sdpa_math_fallback",
        Severity.MEDIUM,
        CATEGORY,
        f"scaled_dot_product_attention runs its math backend ({math[0].count} calls): no fused "
        "kernel was chosen (dtype, mask, head size or dropout ruled them out)",
        (
            Evidence(
                _MATH_OP, round(math[0].total_us / 1e3, 2), f"ms in {math[0].count} calls", src
            ),
            Evidence("share of step time", round(100 * share, 1), "%", src),
        ),
        threshold=f"{_MATH_OP} >= {MATH_SHARE:.0%} of step time",
        fix=FixRef("attention.backend", {"backend": "flash"}),
        instruction="force a backend with torch.nn.attention.sdpa_kernel to see why it is "
        "refused (the warning names the reason); fp16/bf16 and head size <= 256 suit flash",
        estimated_gain=share * _FUSED_SAVING,
    )
