"""attention.eager: hand-written attention found in the op tree, costed, and ranked by its cost;
the sequence length inside it is not GEMM-alignment advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudiag.analysis.trace import analyze_trace
from gpudiag.fixes import Fix
from gpudiag.rules.engine import Diagnosis, EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity
from tests.analysis.trace.test_trace_attention import EagerAttention, SdpaAttention, _profile
from tests.rules.test_rules_scenarios import BF16, TC_GEMM, UNALIGNED_GEMM, Kineto

SOFTMAX = (
    "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, "
    "10, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, "
    "bool)"
)
SCALE = "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>"
SEQ, HEADS, HEAD_DIM = 1001, 12, 64  # a sequence length off a multiple of 8


def _layer(k: Kineto, *, softmax: bool) -> None:
    """A bf16 transformer layer: aligned projections around attention over 1001 tokens."""
    x = [8, SEQ, HEADS * HEAD_DIM]
    w = [3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM]
    k.launch("aten::linear", TC_GEMM, 300.0, input_dims=[x, w, []], input_types=[BF16] * 3)
    q, kt = [8, HEADS, SEQ, HEAD_DIM], [8, HEADS, HEAD_DIM, SEQ]
    k.launch("aten::matmul", UNALIGNED_GEMM, 400.0, input_dims=[q, kt], input_types=[BF16] * 2)
    if softmax:
        k.launch("aten::mul", SCALE, 300.0)
        k.launch("aten::softmax", SOFTMAX, 900.0)
    p, v = [8, HEADS, SEQ, SEQ], [8, HEADS, SEQ, HEAD_DIM]
    k.launch("aten::matmul", UNALIGNED_GEMM, 400.0, input_dims=[p, v], input_types=[BF16] * 2)
    k.launch(
        "aten::linear",
        TC_GEMM,
        100.0,
        input_dims=[x, [HEADS * HEAD_DIM, HEADS * HEAD_DIM], []],
        input_types=[BF16] * 3,
    )
    k.wait_gpu()


def _diagnose(tmp_path: Path, *, softmax: bool) -> tuple[Any, Diagnosis]:
    k = Kineto()
    for n in range(1, 6):
        k.step(n, lambda: _layer(k, softmax=softmax))
    trace = analyze_trace(k.write(tmp_path / "rank0.pt.trace.json"))
    return trace, run_rules(EvidenceBundle(trace=trace, env={}))


def test_eager_attention_on_the_gpu_is_the_top_finding_not_alignment(tmp_path: Path) -> None:
    trace, diagnosis = _diagnose(tmp_path, softmax=True)
    use = trace.attention()
    assert use.eager_calls == 4  # the last of 5 steps is left out, as HTA does
    assert use.timed_on == "gpu"
    # Forward: QK^T 400 + scale 300 + softmax 900 + PV 400 us of kernels per call.
    assert use.forward_us == 4 * 2000.0
    assert use.softmax_us == 4 * 900.0
    top = diagnosis.findings[0]
    assert top.id == "attention.eager"
    assert top.fix is not None
    assert top.fix.id == "attention.backend"
    assert top.fix == Fix("attention.backend", backend="sdpa")
    assert 'attn_implementation="sdpa"' in top.instruction
    assert top.severity is Severity.HIGH
    assert top.estimated_gain is not None
    assert 0.1 < top.estimated_gain < 0.5
    # 1001 is the sequence length inside attention: not padding advice.
    assert "shapes.gemm_alignment" not in diagnosis.ids()
    assert {g.in_attention for g in trace.gemm_shapes() if g.name == "aten::matmul"} == {True}


def test_the_same_unaligned_products_outside_attention_get_alignment_advice(
    tmp_path: Path,
) -> None:
    trace, diagnosis = _diagnose(tmp_path, softmax=False)
    assert trace.attention().eager_calls == 0
    assert "attention.eager" not in diagnosis.ids()
    assert "shapes.gemm_alignment" in diagnosis.ids()


def test_eager_attention_profiled_on_the_cpu(tmp_path: Path) -> None:
    # 512 tokens, so that attention (its seq x seq work) is most of the step. At 128 tokens the
    # linear layers' GEMMs are a like share, and on a busy 2-core machine one of them, split
    # across two threads, waits at its barrier for a descheduled thread: it took 100 ms of a
    # 175 ms step while attention's own took 3 ms, and attention fell under the rule's 5 %
    # (attention's share over 10 profiles on a load of 9: 3.5 % to 78 % at 128 tokens, 46 % to
    # 91 % at 512).
    trace = _profile(EagerAttention(), tmp_path, seq=512)
    diagnosis = run_rules(EvidenceBundle(trace=trace, env={}))
    eager = next(f for f in diagnosis.findings if f.id == "attention.eager")
    assert eager.fix is not None
    assert eager.fix.id == "attention.backend"
    calls = next(e for e in eager.evidence if e.name == "eager attention calls")
    assert calls.value == 2
    share = next(e for e in eager.evidence if e.name == "share of the run")
    assert eager.estimated_gain is not None
    assert abs(eager.estimated_gain - share.value / 100 * 0.5) < 1e-3


def test_sdpa_profiled_on_the_cpu_has_no_eager_finding(tmp_path: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_profile(SdpaAttention(), tmp_path), env={}))
    assert "attention.eager" not in diagnosis.ids()
