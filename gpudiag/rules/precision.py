"""Precision rules: matmul/convolution time that could run on tensor cores but does not."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.analysis.trace.kernels import is_tensor_core_eligible_op
from gpudiag.analysis.trace.ledger import GEMM_CUDA_CORES
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import span_us, trace_device, trace_source
from gpudiag.rules.engine import EvidenceBundle, revises, rule
from gpudiag.rules.finding import (
    Evidence,
    Finding,
    FixRef,
    NotEvaluated,
    Severity,
    severity_for_gain,
)

if TYPE_CHECKING:
    import torch

    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "precision"

# Share of compute-kernel time in tensor-core-eligible operators (matmul, convolution) whose
# kernels did not use tensor cores. torch-tb-profiler flags "eligible but 0 % tensor cores".
ELIGIBLE_UNUSED = 0.02
# Tensor cores run these kernels at least ~2x faster than fp32 CUDA cores (fp16/bf16 peak is
# 8-16x the fp32 peak on V100/A100); half of their time is a conservative gain.
_TENSOR_CORE_SAVING = 0.5
_TENSOR_CORE_SOURCE = (
    "a conservative estimate: tensor cores run these GEMMs at least 2x faster than fp32 on "
    "the CUDA cores (their fp16/bf16 peak is 8-16x the fp32 peak on V100/A100, spec table)"
)


def _fix_for(cc: tuple[int, int]) -> tuple[FixRef, str]:
    from gpudiag.specs import features

    feats = features(cc)
    if feats.bf16:
        return (
            FixRef("precision.bf16"),
            "bf16 autocast for the forward pass; or precision.tf32 (one line, keeps fp32 "
            "weights and most of the accuracy) for matmuls and convolutions",
        )
    return (
        FixRef("precision.fp16"),
        f"cc {cc[0]}.{cc[1]} has fp16 tensor cores but no bf16/TF32: fp16 autocast with a "
        "GradScaler",
    )


# Kernel names that say the dtype, for traces recorded without input types: cuBLAS/cuDNN's
# s-prefixed fp32 kernels (sgemm, scudnn, gcgemm), templates on float, Tensile's single
# precision "_SB_"; and the half/bf16/8-bit spellings (h884, bf16, Tensile "BBS"/"HHS").
_FP32_KERNEL = re.compile(r"sgemm|scudnn|gcgemm|<float\b|f32f32_f32f32|^Cijk_\w*?_SB_", re.I)
_REDUCED_KERNEL = re.compile(
    r"h884|h1688|h16816|hgemm|bf16|fp16|half|bfloat16|e4m3|e5m2|i8816|int8|_BBS_|_HHS_|_BB_",
    re.I,
)


@dataclass(frozen=True)
class _Fp32Work:
    """Eligible time off tensor cores that ran in fp32, and where the dtype was read."""

    off_tensor_cores_us: float
    by_dtype_us: dict[str, float]  # eligible GPU time per dtype, where it was read
    read_from: str


def _fp32_work(trace: TraceReport, unused_us: float) -> _Fp32Work | None:
    """How much of ``unused_us`` (eligible time off tensor cores) ran in fp32 (None: the
    trace says no dtype). The operators' recorded input types decide; kernel names only when
    the trace has none. Time not tied to a typed operator (backward kernels) is split as the
    typed time is."""
    by_dtype: dict[str, float] = {}
    off_typed = off_fp32 = 0.0
    for op in trace.shaped_ops():
        if op.dtype is None or not op.gpu_us:
            continue
        by_dtype[op.dtype] = by_dtype.get(op.dtype, 0.0) + op.gpu_us
        off = max(op.gpu_us - (op.tensor_core_us or 0.0), 0.0)
        off_typed += off
        off_fp32 += off if op.dtype == "fp32" else 0.0
    typed = sum(by_dtype.values())
    if typed > 0:
        rest = max(unused_us - off_typed, 0.0) * by_dtype.get("fp32", 0.0) / typed
        return _Fp32Work(off_fp32 + rest, by_dtype, "operator input types")
    named: dict[str, float] = {}
    for k in trace.kernels():
        if k.category != "compute" or k.tensor_cores or not k.launched_by:
            continue
        if not is_tensor_core_eligible_op(k.launched_by):
            continue
        dtype = (
            "fp32"
            if _FP32_KERNEL.search(k.name)
            else "bf16/fp16"
            if _REDUCED_KERNEL.search(k.name)
            else None
        )
        if dtype is not None:
            named[dtype] = named.get(dtype, 0.0) + k.total_us
    if not named:
        return None
    fp32_share = named.get("fp32", 0.0) / sum(named.values())
    return _Fp32Work(unused_us * fp32_share, named, "kernel names (no input types recorded)")


def _dtype_text(by_dtype: dict[str, float]) -> str:
    total = sum(by_dtype.values())
    parts = sorted(by_dtype.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{d} {100 * us / total:.0f}%" for d, us in parts)


@rule("precision.tensor_cores", category=CATEGORY, needs=("gpu_trace",))
def tensor_cores_unused(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Tensor-core-eligible matmul/convolution time that ran in fp32 on the CUDA cores."""
    trace = evidence.trace_report
    cc, name = trace_device(evidence)
    if cc is None:
        yield NotEvaluated("precision.tensor_cores", "the GPU's compute capability")
        return
    if cc < (7, 0):
        return  # no tensor cores: nothing to gain
    uses = [r.tensor_cores for r in trace.ranks if r.tensor_cores is not None]
    unused_us = [u.eligible_without_tensor_cores_us for u in uses]
    if not uses or any(u is None for u in unused_us):
        yield NotEvaluated(
            "precision.tensor_cores", "kernels tied to their operators (External id in the trace)"
        )
        return
    compute_us = sum(u.compute_us for u in uses)
    unused_names = sum(u for u in unused_us if u is not None)
    if compute_us <= 0 or unused_names / compute_us < ELIGIBLE_UNUSED:
        return
    # A precision finding asserts a dtype: it must have read it (bf16 GEMMs whose kernel
    # names gpudiag does not know are not fp32 work off the tensor cores).
    work = _fp32_work(trace, unused_names)
    if work is None:
        yield NotEvaluated(
            "precision.tensor_cores",
            "the dtype the matmuls ran in (profile with record_shapes=True)",
        )
        return
    unused = work.off_tensor_cores_us
    unused_share = unused / compute_us
    if unused_share < ELIGIBLE_UNUSED:
        return
    tc_share = trace.tensor_core_share or 0.0
    # One line per operator: the same operator on several ranks is summed over them.
    off_by_op: dict[str, float] = {}
    for u in uses:
        for op in u.eligible_ops:
            if op.kernel_us > op.tensor_core_us:
                off_by_op[op.name] = off_by_op.get(op.name, 0.0) + op.kernel_us - op.tensor_core_us
    ops = sorted(off_by_op.items(), key=lambda kv: -kv[1])
    summed = f" ({len(uses)} ranks summed)" if len(uses) > 1 else ""
    src = trace_source(trace)
    items = [
        Evidence(
            "fp32 eligible time off tensor cores", round(100 * unused_share, 1), "% of compute", src
        ),
        Evidence(
            "matmul/convolution time by dtype", _dtype_text(work.by_dtype_us), "", work.read_from
        ),
        Evidence("tensor-core share of compute time", round(100 * tc_share, 1), "%", src),
        Evidence("GPU", f"{name} (cc {cc[0]}.{cc[1]})", source=src),
    ]
    items += [
        Evidence(f"{name} off tensor cores{summed}", round(off_us / 1e3, 2), "ms", src)
        for name, off_us in ops[:3]
    ]
    found = claim(
        trace, (GEMM_CUDA_CORES,), _TENSOR_CORE_SAVING, _TENSOR_CORE_SOURCE, claimed_us=unused
    )
    span = span_us(trace)
    if found is not None:
        gain: float | None = found.gain
        items += found.evidence(src)
    else:
        gain = unused * _TENSOR_CORE_SAVING / span if span else None
    severity = (
        severity_for_gain(gain)
        if gain is not None
        else Severity.MEDIUM
        if unused_share >= 0.10
        else Severity.LOW
    )
    fix, how = _fix_for(cc)
    yield Finding(
        "precision.fp32_on_tensor_cores",
        severity,
        CATEGORY,
        f"{unused_share:.0%} of GPU compute time is fp32 matmul/convolution off the tensor "
        f"cores (dtype from {work.read_from}: {_dtype_text(work.by_dtype_us)}; kernel names "
        f"show {tc_share:.0%} tensor-core time)",
        tuple(items),
        threshold=f"cc >= 7.0, fp32 eligible time off tensor cores >= {ELIGIBLE_UNUSED:.0%} of "
        "compute (dtype read from the operators' input types, else from kernel names)",
        fix=fix,
        instruction=how,
        estimated_gain=gain,
        claims=(GEMM_CUDA_CORES,) if found is not None else (),
    )


def _reduced_precision_matmul_share(trace: TraceReport | None) -> float | None:
    """Share of the trace's matmul host time spent with bf16/fp16 inputs (None: no shapes)."""
    gemms = [g for g in trace.gemm_shapes() if g.dtype is not None] if trace is not None else []
    total = sum(g.cpu_us for g in gemms)
    if total <= 0:
        return None
    return sum(g.cpu_us for g in gemms if g.dtype in {"bf16", "fp16"}) / total


# The step's own matmuls timed for CPU bf16 advice: the largest by FLOPs (a step makes the same
# products every time; host times in a profiled step move with the machine's load, and picking
# by them picked other shapes from run to run, with bf16 ratios from 0.4x to 1.6x) until they
# cover this share of its fp32 matmul FLOPs, at most MAX_TIMED_MATMULS of them.
TIMED_MATMUL_SHARE = 0.8
MAX_TIMED_MATMULS = 4


def _fp32_matmuls(
    trace: TraceReport | None,
) -> tuple[list[tuple[tuple[int, int, int], int]], float]:
    """The step's largest fp32 matrix products by FLOPs, each (M, N, K) with how many a step
    makes (see TIMED_MATMUL_SHARE), and the share of its fp32 matmul FLOPs they cover; ([], 0)
    without a trace that recorded shapes."""
    calls: dict[tuple[int, int, int], int] = {}
    for g in trace.gemm_shapes() if trace is not None else ():
        if g.dtype in (None, "fp32") and not g.in_attention and g.count > 0:
            shape = (g.dims.m, g.dims.n, g.dims.k)
            calls[shape] = calls.get(shape, 0) + g.count * g.dims.batch

    def flops(item: tuple[tuple[int, int, int], int]) -> int:
        (m, n, k), count = item
        return 2 * m * n * k * count

    ranked = sorted(calls.items(), key=lambda item: (-flops(item), item[0]))
    total = sum(flops(item) for item in ranked)
    chosen: list[tuple[tuple[int, int, int], int]] = []
    for item in ranked[:MAX_TIMED_MATMULS]:
        chosen.append(item)
        if sum(flops(c) for c in chosen) >= TIMED_MATMUL_SHARE * total:
            break
    return chosen, (sum(flops(c) for c in chosen) / total if total else 0.0)


def _fp32_params(model: torch.nn.Module | None) -> bool:
    import torch

    params = list(model.parameters()) if model is not None else []
    return bool(params) and all(p.dtype == torch.float32 for p in params)


CPU_BF16_RULE = "precision.cpu_bf16"
# The finding's own evidence about the host and the model, kept when a trial revises it.
_HOST_EVIDENCE = ("CPU", "bf16 instructions", "parameter dtype")


def _bf16_trial(workload: Any) -> Any:
    """The decisive trial of precision.bf16 on this workload measured in this process."""
    from gpudiag import _measured

    subject = workload.model if workload.model is not None else workload.step_fn
    measured = _measured.trial(subject, workload.describe(), "precision.bf16")
    return measured if measured is not None and measured.decisive else None


def _trial_finding(measured: Any, items: tuple[Evidence, ...]) -> Finding:
    """The bf16 advice from a measured trial of precision.bf16 on the step itself."""
    evidence = (
        *items,
        Evidence(
            "precision.bf16 on this step",
            f"{measured.verdict}, {measured.speedup}",
            "",
            measured.source,
        ),
    )
    threshold = (
        "a trial of precision.bf16 on this workload (gd.compare, in this process): it replaces "
        "the matmul micro-benchmark"
    )
    if measured.verdict == "faster":
        return Finding(
            "precision.cpu_fp32_with_bf16",
            Severity.MEDIUM,
            CATEGORY,
            f"bf16 autocast measured faster on this step: {measured.speedup}",
            evidence,
            threshold=threshold,
            fix=FixRef("precision.bf16"),
            instruction="keep it: comparison.recipe() carries it to a training script",
            rule=CPU_BF16_RULE,
        )
    return Finding(
        "precision.cpu_bf16_not_faster",
        Severity.INFO,
        CATEGORY,
        f"bf16 autocast measured {measured.verdict} on this step ({measured.speedup}): not a "
        "reason to switch to bf16",
        evidence,
        threshold=threshold,
        instruction="keep fp32 for this step",
        rule=CPU_BF16_RULE,
    )


@revises(CPU_BF16_RULE)
def _measured_since(finding: Finding, workload: Any) -> Finding:
    """A diagnosis shown after gd.compare measured precision.bf16 on its workload reads the
    trial, not the micro-benchmark it was made with."""
    measured = _bf16_trial(workload)
    if measured is None:
        return finding
    items = tuple(e for e in finding.evidence if e.name in _HOST_EVIDENCE)
    return _trial_finding(measured, items)


@rule(CPU_BF16_RULE, category=CATEGORY, needs=("system", "workload"))
def cpu_fp32_with_bf16(evidence: EvidenceBundle) -> Iterator[Finding]:
    """An fp32 workload on a CPU where bf16 matmuls were measured faster than fp32."""
    workload = evidence.workload_given
    if workload.device_type != "cpu" or not _fp32_params(workload.model):
        return
    reduced = _reduced_precision_matmul_share(evidence.trace)
    if reduced is not None and reduced >= 0.5:
        return  # the step already autocasts: its matmuls ran in bf16/fp16
    host = evidence.system_report.host
    if not host.cpu_bf16_instructions:
        return  # no bf16 instructions: bf16 would be emulated
    from gpudiag.fixes import Fix

    ok, _ = Fix("precision.bf16").supported(evidence.system, "cpu")
    if not ok:
        return
    if evidence.system_report.is_recording:
        return  # a recorded machine's CPU cannot be measured from here
    flags = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in host.cpu_flags]
    items = [
        Evidence("CPU", host.cpu_model.get("unknown"), source="host"),
        Evidence("bf16 instructions", ", ".join(flags), source="host (cpu flags)"),
        Evidence("parameter dtype", "float32", source="workload"),
    ]
    measured = _bf16_trial(workload)
    if measured is not None:  # the step itself was measured: no prediction is needed
        yield _trial_finding(measured, tuple(items))
        return
    from gpudiag.bench.cpu_bf16 import FAST_RATIO, cpu_bf16_speed, workload_bf16_speed

    # The flags say bf16 has instructions, not that torch runs it faster: measure (cached),
    # on the step's own largest fp32 matmul when a trace with shapes says which it is.
    own, covered = _fp32_matmuls(evidence.trace)
    speed = workload_bf16_speed(own, covered=covered) if own else cpu_bf16_speed()
    if speed.measured:
        items.append(
            Evidence("bf16 / fp32 matmul speed", round(speed.ratio or 0.0, 2), "x", speed.source)
        )
        items.append(Evidence("its interval", speed.interval, source=speed.source))
    if reduced is not None:
        items.append(
            Evidence(
                "matmul time in bf16/fp16",
                round(100 * reduced, 1),
                "%",
                trace_source(evidence.trace),
            )
        )
    whose = "the step's own matmuls" if own else "its matmuls"
    threshold = (
        f"fp32 parameters on a CPU with AVX512-BF16 or AMX where bf16 measured at least "
        f"{FAST_RATIO:.2f}x the speed of fp32 over the whole {speed.confidence:.0%} interval "
        "(on the step's own matmuls when a trace with shapes is at hand, else a 512-cubed "
        "product), and under half of the traced matmul time in bf16/fp16; an interval "
        f"across {FAST_RATIO:.2f}x is undecided; a trial of precision.bf16 on the step "
        "replaces the micro-benchmark"
    )
    low, high = speed.low, speed.high
    if speed.measured and low is not None and high is not None and low < FAST_RATIO <= high:
        yield Finding(
            "precision.cpu_bf16_undecided",
            Severity.LOW,
            CATEGORY,
            f"this CPU has bf16 instructions; {whose} in bf16 measured {speed.ratio:.2f}x the "
            f"speed of fp32 ({speed.interval}): undecided whether bf16 autocast pays here, "
            "a trial on the step decides",
            tuple(items),
            threshold=threshold,
            fix=FixRef("precision.bf16"),
            instruction="gd.compare measures bf16 autocast on the whole step",
        )
        return
    if not (speed.measured and low is not None and low >= FAST_RATIO):
        what = (
            f"measured {speed.ratio:.2f}x the speed of fp32 here ({speed.interval})"
            if speed.measured
            else f"could not be measured ({speed.reason})"
        )
        yield Finding(
            "precision.cpu_bf16_not_faster",
            Severity.INFO,
            CATEGORY,
            f"this CPU has bf16 instructions, but {whose} in bf16 {what}: not a reason to "
            "switch to bf16 autocast",
            tuple(items),
            threshold=threshold,
            instruction="keep fp32; re-measure with gd.bench.matmul(dtypes=['fp32', 'bf16'])",
        )
        return
    ratio = speed.ratio or 0.0
    faster = "several times" if ratio >= 2.5 else f"{ratio:.1f}x"
    yield Finding(
        "precision.cpu_fp32_with_bf16",
        Severity.MEDIUM,
        CATEGORY,
        f"the workload trains in fp32 on a CPU where {whose} in bf16 measured {faster} faster "
        f"than fp32 ({speed.interval}): bf16 autocast should speed up its matmuls",
        tuple(items),
        threshold=threshold,
        fix=FixRef("precision.bf16"),
        instruction="torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss "
        "(skip this if the step already autocasts)",
    )
