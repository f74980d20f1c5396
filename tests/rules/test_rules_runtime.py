"""Runtime rules: this process's torch switches against real recorded GPUs and traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.doctor import diagnose
from gpudiag.fixes import Fix
from gpudiag.probe.readings import ok
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.rules.engine import Diagnosis, EvidenceBundle, run_rules
from gpudiag.rules.finding import Finding, Severity
from gpudiag.rules.runtime import SOURCE, conv_time, matmul_tf32
from tests.fakes.machines import cpu_system

RESNET_W4 = "kineto-resnet50_num_workers_4-worker0.1623213129365.pt.trace.json.gz"
RESNET_PID = 1623213129365  # the number in the file's name, where gd.profile puts the pid
EMBEDDING_A100 = "hta-trace_diff-control.json.gz"  # no convolutions at all

_TRACES: dict[str, TraceReport] = {}


def _system(fixtures_dir: Path, name: str) -> SystemReport:
    return inspect(replay=fixtures_dir / "nvidia-smi-xml" / name)


def _trace(fixtures_dir: Path, name: str) -> TraceReport:
    if name not in _TRACES:
        _TRACES[name] = analyze_trace(fixtures_dir / "traces" / name)
    return _TRACES[name]


def _run(runtime: dict[str, Any], **evidence: Any) -> Diagnosis:
    evidence.setdefault("env", {})
    return run_rules(EvidenceBundle(runtime=runtime, **evidence))


def _found(diagnosis: Diagnosis, finding_id: str) -> Finding | None:
    hits = [f for f in diagnosis.findings if f.id == finding_id]
    assert len(hits) <= 1
    return hits[0] if hits else None


# -- TF32 on a GPU without TF32 --------------------------------------------------------------


@pytest.mark.parametrize(
    "runtime",
    [
        {"matmul_fp32_precision": "tf32"},
        {"float32_matmul_precision": "high"},
        {"float32_matmul_precision": "medium"},
        {"matmul_allow_tf32": True},
    ],
)
def test_tf32_on_a_t4_does_nothing(fixtures_dir: Path, runtime: dict[str, Any]) -> None:
    finding = _found(
        _run(runtime, system=_system(fixtures_dir, "tesla-t4.xml")), "runtime.tf32_without_tf32"
    )
    assert finding is not None
    assert finding.severity is Severity.INFO
    assert "cc 7.5" in finding.message
    assert finding.fix is not None
    assert finding.fix.id == "precision.fp16"  # Turing has fp16 tensor cores, not TF32
    assert finding.evidence[0].source == SOURCE


def test_tf32_on_ampere_or_switched_off_is_silent(fixtures_dir: Path) -> None:
    on = {"float32_matmul_precision": "high"}
    assert (
        _found(_run(on, system=_system(fixtures_dir, "a10g.xml")), "runtime.tf32_without_tf32")
        is None
    )
    t4 = _system(fixtures_dir, "tesla-t4.xml")
    off = {"float32_matmul_precision": "highest", "matmul_allow_tf32": False}
    assert _found(_run(off, system=t4), "runtime.tf32_without_tf32") is None


def test_newer_fp32_precision_setting_wins_over_the_legacy_flag() -> None:
    enabled, switch = matmul_tf32(
        {"matmul_fp32_precision": "ieee", "float32_matmul_precision": "high"}
    )
    assert enabled is False
    assert switch is not None
    assert switch.name == "torch.backends.cuda.matmul.fp32_precision"
    # "none" means "inherit": the legacy setting decides.
    assert matmul_tf32({"matmul_fp32_precision": "none", "float32_matmul_precision": "high"})[0]
    assert matmul_tf32({}) == (None, None)


def test_tf32_on_pascal_has_no_fix(fixtures_dir: Path) -> None:
    diagnosis = _run({"matmul_allow_tf32": True}, system=_system(fixtures_dir, "quadro-p400.xml"))
    finding = _found(diagnosis, "runtime.tf32_without_tf32")
    assert finding is not None
    assert finding.fix is None
    assert "no tensor cores" in finding.instruction


def test_source_and_runtime_rules_both_name_their_evidence(fixtures_dir: Path) -> None:
    diagnosis = _run(
        {"matmul_allow_tf32": True},
        system=_system(fixtures_dir, "tesla-t4.xml"),
        code="torch.backends.cuda.matmul.allow_tf32 = True\n",
    )
    from_code = _found(diagnosis, "code.tf32_without_tf32")
    from_runtime = _found(diagnosis, "runtime.tf32_without_tf32")
    assert from_code is not None
    assert from_runtime is not None
    assert from_code.evidence[0].source == "source code"
    assert from_runtime.evidence[0].source == SOURCE
    assert "this process" in from_runtime.message


# -- anomaly detection, determinism ----------------------------------------------------------


def test_anomaly_detection_is_high_with_a_gpu_medium_without(fixtures_dir: Path) -> None:
    runtime = {"anomaly_detection": True, "anomaly_check_nan": True}
    gpu = _found(
        _run(runtime, system=_system(fixtures_dir, "a10g.xml")), "runtime.anomaly_detection_on"
    )
    cpu = _found(_run(runtime, system=cpu_system()), "runtime.anomaly_detection_on")
    assert gpu is not None
    assert cpu is not None
    assert (gpu.severity, cpu.severity) == (Severity.HIGH, Severity.MEDIUM)
    assert "set_detect_anomaly(False)" in gpu.instruction
    assert (
        _found(
            _run({"anomaly_detection": False}, system=cpu_system()), "runtime.anomaly_detection_on"
        )
        is None
    )


@pytest.mark.parametrize("switch", ["deterministic_algorithms", "cudnn_deterministic"])
def test_determinism_on_a_gpu_is_low(fixtures_dir: Path, switch: str) -> None:
    diagnosis = _run({switch: True}, system=_system(fixtures_dir, "a10g.xml"))
    finding = _found(diagnosis, "runtime.deterministic_algorithms")
    assert finding is not None
    assert finding.severity is Severity.LOW
    assert len(finding.evidence) == 1


def test_determinism_needs_a_gpu() -> None:
    diagnosis = _run({"deterministic_algorithms": True}, system=cpu_system())
    assert "runtime.deterministic_algorithms" not in diagnosis.ids()
    assert "runtime.determinism" in {n.rule for n in diagnosis.not_evaluated}


# -- cuDNN against the convolutions of a real ResNet-50 trace --------------------------------


def _cudnn_runtime(**switches: Any) -> dict[str, Any]:
    return {"pid": RESNET_PID, "cudnn_available": True, "cudnn_enabled": True, **switches}


def test_benchmark_off_with_convolution_time_suggests_the_fix(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, RESNET_W4)
    conv_us, compute_us = conv_time(trace)
    assert conv_us / compute_us > 0.5  # ResNet-50 on a V100 is mostly convolution
    diagnosis = _run(_cudnn_runtime(cudnn_benchmark=False), trace=trace)
    finding = _found(diagnosis, "runtime.cudnn_benchmark_off")
    assert finding is not None
    assert finding.severity is Severity.MEDIUM
    assert finding.fix is not None
    assert finding.fix.id == "cudnn.benchmark"
    assert finding.fix.to_fix().id == "cudnn.benchmark"
    assert "cudnn.benchmark" in [f.id for f in diagnosis.recommended()]
    assert (
        _found(
            _run(_cudnn_runtime(cudnn_benchmark=True), trace=trace), "runtime.cudnn_benchmark_off"
        )
        is None
    )


def test_cudnn_disabled_outranks_benchmark(fixtures_dir: Path) -> None:
    runtime = _cudnn_runtime(cudnn_enabled=False, cudnn_benchmark=False)
    diagnosis = _run(runtime, trace=_trace(fixtures_dir, RESNET_W4))
    finding = _found(diagnosis, "runtime.cudnn_disabled")
    assert finding is not None
    assert finding.severity is Severity.HIGH
    assert "runtime.cudnn_benchmark_off" not in diagnosis.ids()


def test_trace_from_another_process_is_not_judged(fixtures_dir: Path) -> None:
    runtime = _cudnn_runtime(cudnn_benchmark=False, pid=RESNET_PID + 1)
    diagnosis = _run(runtime, trace=_trace(fixtures_dir, RESNET_W4))
    assert "runtime.cudnn_benchmark_off" not in diagnosis.ids()
    skipped = {n.rule: n.missing for n in diagnosis.not_evaluated}
    assert "another run" in skipped["runtime.cudnn"]


def test_no_convolutions_no_cudnn_finding(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, EMBEDDING_A100)
    assert conv_time(trace)[0] == 0.0
    diagnosis = _run(_cudnn_runtime(cudnn_benchmark=False), trace=trace)
    assert not [i for i in diagnosis.ids() if i.startswith("runtime.cudnn")]
    assert "runtime.cudnn" not in {n.rule for n in diagnosis.not_evaluated}


# -- SDPA backends ---------------------------------------------------------------------------

_MATH_ONLY = {"sdp_flash": False, "sdp_mem_efficient": False, "sdp_cudnn": False, "sdp_math": True}


@pytest.mark.parametrize(
    ("xml", "backend"),
    [("a10g.xml", "flash"), ("tesla-t4.xml", "efficient"), ("gt-1030.xml", "efficient")],
)
def test_math_only_sdpa_points_at_the_best_fused_kernel(
    fixtures_dir: Path, xml: str, backend: str
) -> None:
    finding = _found(_run(_MATH_ONLY, system=_system(fixtures_dir, xml)), "runtime.sdpa_math_only")
    assert finding is not None
    assert finding.severity is Severity.LOW
    assert finding.fix is not None
    assert finding.fix.id == "attention.backend"
    assert finding.fix == Fix("attention.backend", backend=backend)
    assert finding.fix.to_fix().supported(_system(fixtures_dir, xml), "cuda")[0]


def test_a_fused_backend_the_gpu_runs_keeps_sdpa_fast(fixtures_dir: Path) -> None:
    t4 = _system(fixtures_dir, "tesla-t4.xml")
    efficient_on = {**_MATH_ONLY, "sdp_mem_efficient": True}
    assert _found(_run(efficient_on, system=t4), "runtime.sdpa_math_only") is None
    # Flash left on does not help a T4 (flash needs cc 8.0): SDPA still takes the math path.
    flash_only = {**_MATH_ONLY, "sdp_flash": True}
    finding = _found(_run(flash_only, system=t4), "runtime.sdpa_math_only")
    assert finding is not None
    assert finding.fix == Fix("attention.backend", backend="efficient")


def test_flash_off_on_the_cpu_is_found() -> None:
    finding = _found(
        _run({"sdp_flash": False, "sdp_math": True}, system=cpu_system()), "runtime.sdpa_math_only"
    )
    assert finding is not None
    assert finding.fix == Fix("attention.backend", backend="flash")
    assert "this CPU" in finding.message
    defaults = {"sdp_flash": True, "sdp_mem_efficient": True, "sdp_math": True, "sdp_cudnn": True}
    assert _found(_run(defaults, system=cpu_system()), "runtime.sdpa_math_only") is None


def test_sdpa_switches_cost_nothing_when_the_traced_step_has_no_attention(
    fixtures_dir: Path,
) -> None:
    runtime = {**_MATH_ONLY, "pid": RESNET_PID}
    t4 = _system(fixtures_dir, "tesla-t4.xml")
    with_trace = _run(runtime, system=t4, trace=_trace(fixtures_dir, RESNET_W4))
    assert "runtime.sdpa_math_only" not in with_trace.ids()
    assert "runtime.sdpa_math_only" in _run(runtime, system=t4).ids()


# -- CPU threads -----------------------------------------------------------------------------


def test_few_threads_on_a_cpu_only_run() -> None:
    runtime = {"num_threads": 1, "cpu_affinity": 8}
    finding = _found(
        _run(runtime, system=cpu_system(), env={"OMP_NUM_THREADS": "1"}), "runtime.cpu_threads_low"
    )
    assert finding is not None
    assert finding.severity is Severity.LOW
    assert "torch.set_num_threads(8)" in finding.instruction
    assert "OMP_NUM_THREADS" in finding.instruction
    assert ("OMP_NUM_THREADS", "1") in [(e.name, e.value) for e in finding.evidence]


def test_threads_rule_respects_physical_cores_local_ranks_and_gpus(fixtures_dir: Path) -> None:
    system = cpu_system()
    four_physical = dataclasses.replace(
        system, host=dataclasses.replace(system.host, physical_cores=ok(4))
    )
    capped = _found(
        _run({"num_threads": 2, "cpu_affinity": 16}, system=four_physical),
        "runtime.cpu_threads_low",
    )
    assert capped is not None
    assert "torch.set_num_threads(4)" in capped.instruction
    assert (
        _found(
            _run({"num_threads": 3, "cpu_affinity": 4}, system=four_physical),
            "runtime.cpu_threads_low",
        )
        is None
    )
    # torchrun with 4 local ranks on 8 cores: 2 cores each, 1 thread is not "far below".
    shared = _run(
        {"num_threads": 1, "cpu_affinity": 8}, system=system, env={"LOCAL_WORLD_SIZE": "4"}
    )
    assert "runtime.cpu_threads_low" not in shared.ids()
    on_gpu = _run({"num_threads": 1, "cpu_affinity": 8}, system=_system(fixtures_dir, "a10g.xml"))
    assert "runtime.cpu_threads_low" not in on_gpu.ids()


# -- through gd.diagnose ---------------------------------------------------------------------


def test_diagnose_passes_runtime_through(fixtures_dir: Path) -> None:
    diagnosis = diagnose(
        system=_system(fixtures_dir, "tesla-t4.xml"), env={}, runtime={"matmul_allow_tf32": True}
    )
    assert "runtime.tf32_without_tf32" in diagnosis.ids()
    assert "runtime.tf32" in diagnosis.evaluated


def test_diagnose_reads_this_process_by_default() -> None:
    before = torch.is_anomaly_enabled()
    try:
        torch.autograd.set_detect_anomaly(True)
        live = diagnose(system=cpu_system(), env={})
        given = diagnose(system=cpu_system(), env={}, runtime={})
    finally:
        torch.autograd.set_detect_anomaly(before)
    finding = _found(live, "runtime.anomaly_detection_on")
    assert finding is not None
    assert finding.severity is Severity.MEDIUM
    assert "runtime.anomaly_detection_on" not in given.ids()  # an explicit runtime wins
    assert "runtime.anomaly_detection_on" not in diagnose(system=cpu_system(), env={}).ids()


def test_sdpa_rule_reads_a_trace_profiled_in_this_process(tmp_path: Path) -> None:
    from gpudiag.probe.runtime import torch_switches
    from gpudiag.profiling import profile

    q = torch.randn(1, 2, 64, 16)

    def attention() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    def matmul() -> torch.Tensor:
        return q @ q.transpose(-2, -1)

    before = torch.backends.cuda.flash_sdp_enabled()
    try:
        torch.backends.cuda.enable_flash_sdp(False)
        runtime = torch_switches()
        with_sdpa = profile(attention, steps=1, trace_dir=tmp_path)
        without = profile(matmul, steps=1, trace_dir=tmp_path)
    finally:
        torch.backends.cuda.enable_flash_sdp(before)
    assert "runtime.sdpa_math_only" in _run(runtime, system=cpu_system(), trace=with_sdpa).ids()
    assert "runtime.sdpa_math_only" not in _run(runtime, system=cpu_system(), trace=without).ids()
