"""gd.memory: a measured step by category beside the estimate; the user's state untouched."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch

import gpudiag as gd
from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.trial import TrialSnapshot
from gpudiag.profiling.memory import MemoryTimeline


def test_memory_report_measures_on_a_copy_and_explains_the_estimate() -> None:
    wl = workloads.get("gpt", seq_len=128, batch_size=2, d_model=64)
    opt = torch.optim.AdamW(wl.model.parameters())
    snap = TrialSnapshot.capture(wl.model, opt)
    report = gd.memory(wl)
    assert snap.differences() == []
    assert isinstance(report, gd.MemoryReport)
    assert report.estimate is not None
    assert report.peak_bytes == report.timeline.peak_bytes > 0
    assert report.estimate.peak_bytes == pytest.approx(report.peak_bytes, rel=0.05)
    text = report.explain_difference()
    assert text[0].startswith("measured")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["at_peak"]["parameters"] == sum(p.numel() * 4 for p in wl.model.parameters())
    html = gd.MemoryReport("<b>wl</b>", report.timeline)._repr_html_()
    assert "<b>wl</b>" not in html
    assert "&lt;b&gt;wl&lt;/b&gt;" in html
    fig = report.plot()
    assert {t.name for t in fig.data} >= {"parameters", "activations", "optimizer state"}


def test_memory_with_fixes_and_bad_input() -> None:
    wl = workloads.get("gpt", seq_len=128, batch_size=4, d_model=64)
    base = gd.memory(wl, estimate=False)
    ckpt = gd.memory(wl, fixes=["activation.checkpointing"], estimate=False)
    assert ckpt.peak_bytes < base.peak_bytes
    assert ckpt.fixes == ("activation.checkpointing",)
    with pytest.raises(GpuDiagError, match="Workload"):
        gd.memory(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(GpuDiagError, match="step function"):
        gd.memory(gd.Workload.from_step(lambda: None, model=wl.model))


def test_other_processes_from_a_recorded_machine(fixtures_dir: Any) -> None:
    from gpudiag.experiment.memory_report import other_processes
    from gpudiag.probe.system import inspect

    system = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "a10g.xml")
    found = other_processes(system)
    assert {"gpu": 0, "pid": 725, "name": "/usr/lib/xorg/Xorg", "used_bytes": 22 * 2**20} in found
    assert other_processes(system, own_pid=725) == tuple(p for p in found if p["pid"] != 725)
    report = gd.MemoryReport("wl", MemoryTimeline((), ()))
    with_others = dataclasses.replace(report, other_processes=found)
    assert "pid 725" in repr(with_others)


def test_memory_report_without_torchs_private_memory_profiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gd.memory on a torch without ``torch.profiler._memory_profiler`` (deprecated): MemTracker
    categorises the measured step, and the report still explains it."""
    import sys

    monkeypatch.setitem(sys.modules, "torch.profiler._memory_profiler", None)
    wl = workloads.get("gpt", seq_len=128, batch_size=2, d_model=64)
    report = gd.memory(wl)
    assert "MemTracker" in report.timeline.source
    params = sum(p.numel() * 4 for p in wl.model.parameters())
    assert report.timeline.at_peak["parameters"] == params
    assert report.timeline.at_peak["optimizer_state"] >= 2 * params
    assert report.estimate is not None
    assert report.estimate.peak_bytes == pytest.approx(report.peak_bytes, rel=0.15)
