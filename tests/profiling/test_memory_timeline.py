"""Categorised memory timelines: torch's exports read back, and a real step measured on the CPU."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.errors import GpuDiagError
from gpudiag.profiling import memory as pm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "not-kineto"
RAW = FIXTURES / "hta-memory_analysis-memory_timeline.raw.gz"


def test_raw_export_from_a_real_run() -> None:
    with gzip.open(RAW, "rt") as fh:
        events = json.load(fh)
    timeline = pm.read_memory_timeline(RAW)
    # independent check: the running sum of the signed bytes, in time order
    level, peak = 0, 0
    for _, nbytes in sorted(((e[0], e[2]) for e in events), key=lambda e: e[0]):
        level += nbytes
        peak = max(peak, level)
    assert timeline.peak_bytes == peak
    preexisting_params = sum(e[2] for e in events if e[1] == 1 and e[3] == 0)
    assert timeline.rows[0][pm.CATEGORIES.index("parameters")] == preexisting_params
    assert timeline.times_us[0] == 0.0
    assert timeline.at_peak["activations"] > timeline.at_peak["parameters"]  # a training peak
    assert sum(timeline.at_peak.values()) == peak


def test_coalesced_json_export(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    # torch's export_memory_timeline: [times, rows]; column 0 unused, then its 8 categories
    path.write_text(
        json.dumps([[10, 20], [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 50, 7, 0, 3]]])
    )
    timeline = pm.read_memory_timeline(path)
    assert timeline.peak_bytes == 160
    assert timeline.at_peak["activations"] == 50
    assert timeline.at_peak["gradients"] == 7
    assert timeline.at_peak["other"] == 3


@pytest.mark.parametrize(
    "content",
    ["not json", json.dumps({"a": 1}), json.dumps([[0, 9, 1, 0]]), json.dumps([["x", 1, 1, 1]])],
)
def test_bad_timeline_files_are_clear_errors(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(GpuDiagError):
        pm.read_memory_timeline(path)
    with pytest.raises(GpuDiagError, match="no memory timeline"):
        pm.read_memory_timeline(tmp_path / "missing.json")


def test_a_real_cpu_step_is_categorised() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 256)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    timeline = pm.measure_step_timeline(step)
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert timeline.rows[0][pm.CATEGORIES.index("parameters")] == param_bytes
    assert max(timeline.series("gradients")) == param_bytes
    assert timeline.peak_bytes >= 4 * param_bytes  # params + grads + two Adam moments
    assert timeline.peak_bytes > timeline.start_bytes


def _adam_step() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 256)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state exists from here on
    return model, opt, step, sum(p.numel() * 4 for p in model.parameters())


def test_the_private_memory_profiler_is_still_there() -> None:
    """gd.memory reads torch's private memory profiler (the data behind the deprecated
    export_memory_timeline) while this torch has it. When this test fails, torch removed it:
    gd.memory has moved to its fallbacks (tested below with the module hidden); check that
    their figures are what the notebooks and the docs say, then drop this test."""
    assert pm.private_timeline_available(), (
        "torch.profiler._memory_profiler.MemoryProfileTimeline or profile._memory_profile is "
        "gone from this torch"
    )
    model, opt, step, _ = _adam_step()
    timeline = pm.measure_step_timeline(step, track=[model, opt])
    assert timeline.source == pm._PRIVATE_SOURCE


def _hide(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make ``import module`` fail, as on a torch without it."""
    monkeypatch.setitem(sys.modules, module, None)


def test_without_the_private_profiler_memtracker_categorises_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hide(monkeypatch, "torch.profiler._memory_profiler")
    assert not pm.private_timeline_available()
    model, opt, step, param_bytes = _adam_step()
    timeline = pm.measure_step_timeline(step, track=[model, opt])
    assert "MemTracker" in timeline.source
    assert timeline.rows[0][pm.CATEGORIES.index("parameters")] == param_bytes
    assert max(timeline.series("gradients")) == param_bytes
    assert max(timeline.series("optimizer_state")) >= 2 * param_bytes  # Adam's two moments
    assert max(timeline.series("activations")) > 0
    assert timeline.peak_bytes >= 4 * param_bytes


def test_without_memtracker_too_the_total_comes_from_profiler_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hide(monkeypatch, "torch.profiler._memory_profiler")
    _hide(monkeypatch, "torch.distributed._tools.mem_tracker")
    _, _, step, param_bytes = _adam_step()
    timeline = pm.measure_step_timeline(step)
    assert "total only" in timeline.source
    assert timeline.notes
    assert set(timeline.at_peak) >= {"other"}
    assert timeline.at_peak["other"] == timeline.peak_bytes
    assert timeline.peak_bytes >= param_bytes  # at least the gradients the step made


def test_on_a_gpu_without_it_the_allocator_history_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA fallback, fed by a fake torch.cuda.memory history: a real recorded snapshot
    (DeComFL's, with 23,105 alloc/free entries and their stacks)."""
    from gpudiag.analysis.memory_snapshot import load_snapshot
    from gpudiag.probe import capture
    from gpudiag.probe.readings import ok

    recorded = load_snapshot(Path(__file__).parents[1] / "fixtures" / "memory-snapshots"
                             / "decomfl-memory.pickle.gz")  # fmt: skip
    ran: list[bool] = []

    def history(fn: Any, **_: Any) -> Any:
        fn()
        return ok(recorded, capture.SOURCE_SNAPSHOT)

    _hide(monkeypatch, "torch.profiler._memory_profiler")
    monkeypatch.setattr(capture, "cuda_memory_history", history)
    timeline = pm.measure_step_timeline(lambda: ran.append(True), device="cuda:0")
    assert ran == [True]
    assert "_record_memory_history" in timeline.source
    live = sum(
        b["size"]
        for s in recorded["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    )
    assert sum(timeline.rows[-1]) == live  # the history ends where the snapshot is
    assert timeline.peak_bytes >= live
    assert timeline.at_peak["parameters"] > 0
