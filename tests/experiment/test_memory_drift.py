"""Peak memory (profiler events on the CPU, allocator peak through a CUDA fake) and drift."""

from __future__ import annotations

import math

import pytest
import torch

from gpudiag.experiment import memory
from gpudiag.experiment.drift import StepTrace, compare_traces, percent

MIB = 2**20


def test_running_sum_peak_follows_time_order() -> None:
    events = [(3.0, -4), (1.0, 5), (2.0, 2), (4.0, -6)]
    # in time order: +5 -> 5, +2 -> 7, -4 -> 3, -6 -> -3: the peak above the start is 7
    assert memory.peak_of_running_sum(events) == 7
    assert memory.peak_of_running_sum([(0.0, -5)]) == 0


def step_holding(nbytes: int) -> None:
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty(nbytes, dtype=torch.uint8)  # both alive: the peak is 2 x nbytes
    del a, b


def test_cpu_peak_from_profiler_memory_events() -> None:
    result = memory.measure_peak_memory(lambda: step_holding(8 * MIB), device_type="cpu")
    assert result.method == memory.CPU_METHOD
    assert result.peak_bytes is not None
    assert 16 * MIB <= result.peak_bytes < 17 * MIB


def test_cpu_peak_through_the_exported_trace_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_kineto_memory_events", lambda prof: None)
    result = memory.measure_peak_memory(lambda: step_holding(4 * MIB), device_type="cpu")
    assert result.peak_bytes is not None
    assert 8 * MIB <= result.peak_bytes < 9 * MIB


def test_cuda_peak_through_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake of gpudiag.probe.cuda (the allocator counters); untested on a real GPU."""
    state = {"allocated": 100 * MIB, "peak": 0}
    calls: list[str] = []
    monkeypatch.setattr(memory.cuda, "available", lambda: True)
    monkeypatch.setattr(memory.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(memory.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(
        memory.cuda,
        "reset_peak_memory_stats",
        lambda device=None: state.update(peak=state["allocated"]),
    )
    monkeypatch.setattr(memory.cuda, "max_memory_allocated", lambda device=None: state["peak"])

    def step() -> None:
        state["peak"] = state["allocated"] + 300 * MIB

    result = memory.measure_peak_memory(step, device_type="cuda")
    assert (result.peak_bytes, result.above_start_bytes) == (400 * MIB, 300 * MIB)
    assert result.method == memory.CUDA_METHOD
    assert calls == ["sync", "sync"]


def test_cuda_requested_without_cuda_is_not_measured() -> None:
    result = memory.measure_peak_memory(lambda: None, device_type="cuda")
    assert result.peak_bytes is None
    assert "not available" in result.note
    assert str(result).startswith("not measured")


def test_drift_relative_differences_and_floor() -> None:
    base = StepTrace((2.0, 1.5, 1.0), (1.0, 0.8, 0.5))
    same = StepTrace((2.0, 1.5, 1.0), (1.0, 0.8, 0.5))
    cand = StepTrace((2.0, 1.53, 1.0), (1.0, 0.8, 0.6))
    d = compare_traces(base, cand, floor=same)
    assert d.loss_rel == pytest.approx(0.02)
    assert d.grad_norm_rel == pytest.approx(0.2)
    assert d.floor_loss_rel == 0.0
    assert d.status == "large"  # grad norm moved 20 %
    assert "LARGE" in str(d)


def test_drift_non_finite_and_missing() -> None:
    base = StepTrace((1.0, 1.0), (1.0, 1.0))
    assert compare_traces(base, StepTrace((1.0, math.inf), (1.0, 1.0))).status == "non-finite"
    assert compare_traces(base, StepTrace((None, None), (None, None))).status == "not measured"
    assert compare_traces(base, StepTrace((1.0001, 1.0), (1.0, 1.0))).status == "ok"


def test_percent_keeps_small_numbers_readable() -> None:
    assert percent(0.000254) == "0.025%"
    assert percent(0.5) == "50%"
    assert percent(math.inf) == "inf"
