"""The user-facing flows on a real GPU: profile -> analyze_trace, compare of the main fixes on
the demo GPT, a live monitor, and diagnose of planted problems."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpudiag as gd
from gpudiag import workloads
from gpudiag.doctor import profile_workload

pytestmark = pytest.mark.gpu

# Big enough that the GPU, not the launch queue, sets the pace; small enough for seconds.
GPT = {"seq_len": 1024, "batch_size": 8, "d_model": 512, "n_layer": 4, "n_head": 8}


def test_profile_then_analyze_trace(tmp_path: Path, figure: Callable[[str], None]) -> None:
    """gd.profile of the demo GPT, then gd.analyze_trace"""
    workload = workloads.get("gpt", device="cuda", **GPT)
    report = profile_workload(workload, steps=3, trace_dir=str(tmp_path))
    assert report.has_gpu_events
    kernels = report.kernels()
    assert kernels
    again = gd.analyze_trace(report.rank().path)
    assert len(again.kernels()) == len(kernels)
    breakdown = again.time_breakdown()
    share = again.tensor_core_share
    assert share is not None
    span = float(breakdown.get("span_us") or 0)
    idle = float(breakdown.get("idle_us") or 0)
    figure(
        f"{len(kernels)} kernel names, tensor-core share {share:.0%} (fp32 model), "
        f"idle {idle / span:.0%} of {span / 1e3:.0f} ms"
        if span
        else f"{len(kernels)} kernel names, tensor-core share {share:.0%}"
    )


FIXES = [
    "precision.bf16",
    # The demo model is fp32: SDPA picks its memory-efficient kernel (flash needs fp16/bf16).
    "attention.backend=sdpa",
    "compile",
    "cuda.graphs",
    "activation.checkpointing",
]


# The measuring rounds' budget; a time-boxed run (scripts/gpu/check_offline.sh) sets less.
BUDGET_S = float(os.environ.get("GPUDIAG_GPU_CHECK_COMPARE_BUDGET_S", "150"))


@pytest.fixture(scope="module")
def comparison() -> Any:
    workload = workloads.get("gpt", device="cuda", **GPT)
    return gd.compare(workload, FIXES, time_budget_s=BUDGET_S, progress=False)


@pytest.mark.parametrize("fix", FIXES)
def test_compare_fix_on_demo_gpt(comparison: Any, fix: str, figure: Callable[[str], None]) -> None:
    """gd.compare on the demo GPT"""
    arm = comparison.arm(fix)
    assert arm.error is None, arm.error
    speedup = comparison.speedup(fix)
    verdict = comparison.verdict(fix)
    memory = comparison.memory_saving(arm)
    figure(
        f"{fix}: {speedup.value:.2f}x [{speedup.low:.2f}, {speedup.high:.2f}] {verdict}; "
        f"peak memory {memory:+.0%} saved"
    )
    if fix == "precision.bf16":
        assert verdict == "faster"  # fp32 GEMMs are what the demo plants
    if fix == "attention.backend=sdpa":
        assert verdict != "slower"  # a fused kernel instead of softmax(QK^T)V in three launches
    if fix == "activation.checkpointing":
        assert memory > 0.05


def test_monitor_live_gpu(figure: Callable[[str], None]) -> None:
    """gd.monitor on the live GPU"""
    import torch

    monitor = gd.monitor(interval=0.1, display=False)
    try:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize()
    finally:
        monitor.stop()
    assert not monitor.is_recording
    summary = monitor.summary()
    util = [r for r in summary.rows if r.metric == "gpu_util_pct" and r.samples > r.na_samples]
    power = [r for r in summary.rows if r.metric == "power_w" and r.samples > r.na_samples]
    assert summary.ticks >= 15
    assert util
    assert max(r.max for r in util) >= 50
    watts = f", power max {max(r.max for r in power):.0f} W" if power else ""
    figure(
        f"{summary.ticks} ticks in {summary.duration_s:.1f} s, util max "
        f"{max(r.max for r in util):.0f} %{watts}"
    )


PLANTED = {
    # fp32 GEMMs with SDPA attention: the tensor cores sit idle.
    # (runtime.tf32_without_tf32 says the same: fp32 matmuls that could run on tensor cores.)
    "fp32 GEMMs": (
        {"attn_implementation": "sdpa", **GPT},
        {"precision.tensor_cores", "runtime.tf32_without_tf32"},
        1,
    ),
    # Hand-written softmax(QK^T)V at a long sequence.
    "hand-written attention": (
        {**GPT, "seq_len": 2048, "batch_size": 4},
        {"code.manual_attention", "attention.sdpa_math_fallback"},
        3,
    ),
    # One short sequence: the step is launch overhead.
    "tiny batch": (
        {"seq_len": 32, "batch_size": 1, "d_model": 64, "n_layer": 2, "n_head": 2},
        {
            "launch.launch_bound",
            "launch.low_utilization",
            "steps.per_step_overhead",
            "memory.headroom_unused",
        },
        1,
    ),
}


@pytest.mark.parametrize("plant", list(PLANTED))
def test_diagnose_planted_problem(plant: str, figure: Callable[[str], None]) -> None:
    """gd.diagnose of a planted problem"""
    overrides, expected, within = PLANTED[plant]
    workload = workloads.get("gpt", device="cuda", **overrides)
    diagnosis = gd.diagnose(workload)
    ids = [f.id for f in diagnosis.findings]
    assert ids, "no findings"
    assert expected & set(ids[:within]), f"top findings {ids[:3]}, expected one of {expected}"
    figure(f"{plant}: top {ids[0]}; found {', '.join(ids[:3])}")
