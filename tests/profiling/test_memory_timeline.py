"""Categorised memory timelines: torch's exports read back, and a real step measured on the CPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

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
