"""Copies that block the host on pageable memory, and HIP sync calls, read from real traces
(tests/fixtures/traces, SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

from gpudiag.analysis.trace import analyze_trace

DLRM_A100 = "hta-negative_queue_length_values_check-rank0.json.gz"
RESNET_W4 = "kineto-resnet50_num_workers_4-worker0.1623213129365.pt.trace.json.gz"
MI300_COMPILE = "tracelens-torch_compile_triton.json.gz"


def test_pageable_device_to_host_copy_is_a_host_wait(fixtures_dir: Path) -> None:
    # Each step holds one aten::copy_ of 88 longs whose cudaMemcpyAsync blocks ~139-147 ms
    # for a 2 us "Memcpy DtoH (Device -> Pageable)" (704 bytes); before, only the 13 us
    # cudaStreamSynchronize after it was counted.
    rank = analyze_trace(fixtures_dir / "traces" / DLRM_A100).ranks[0]
    long = [s for s in rank.syncs if s.copy and s.duration_us > 100_000]
    assert len(long) == 4  # one per step of the window's 4 steps
    for s in long:
        assert s.name == "cudaMemcpyAsync"
        assert s.copy == "Memcpy DtoH (Device -> Pageable)"
        assert s.copy_bytes == 704
        assert s.copy_gpu_us is not None
        assert s.copy_gpu_us < 10
        assert s.inside_op == "aten::copy_"
        # The GPU ran earlier work part of the wait, not all of it.
        assert s.gpu_busy_us is not None
        assert 0.2 < s.gpu_busy_us / s.duration_us < 0.6


def test_idle_while_the_host_is_blocked_is_named(fixtures_dir: Path) -> None:
    report = analyze_trace(fixtures_dir / "traces" / DLRM_A100)
    rank = report.ranks[0]
    assert rank.breakdown is not None
    assert rank.idle_in_host_waits_us is not None
    inside, queued = rank.idle_in_host_waits_us
    # Most of the "other" idle passes inside those copies, with the next work already queued.
    assert 0.5 < inside / rank.breakdown.idle_us < 0.7
    assert queued / inside > 0.95
    row = dict(report._headline())["idle while the host sat blocked waiting for the GPU"]
    assert "Device -> Pageable" in row
    assert "aten::copy_" in row


def test_pageable_host_to_device_copy_waiting_on_the_stream(fixtures_dir: Path) -> None:
    # The input batch (32x3x224x224 fp32 from pageable memory): cudaMemcpyAsync lasts ~9 ms
    # while the 2.9 ms copy waits behind the previous step's backward on the same stream.
    rank = analyze_trace(fixtures_dir / "traces" / RESNET_W4).ranks[0]
    big = [s for s in rank.syncs if s.copy and s.copy_bytes == 32 * 3 * 224 * 224 * 4]
    assert big
    assert all(s.copy == "Memcpy HtoD (Pageable -> Device)" for s in big)
    in_steps = [s for s in big if s.step is not None and s.duration_us < 20_000]
    assert in_steps
    assert all(s.duration_us > 8_000 for s in in_steps)
    assert all(s.call_site == "resnet50_profiler_api.py(44): <module>" for s in big)


def test_hip_synchronize_is_a_sync(fixtures_dir: Path) -> None:
    rank = analyze_trace(fixtures_dir / "traces" / MI300_COMPILE).ranks[0]
    assert "hipDeviceSynchronize" in {s.name for s in rank.syncs}
