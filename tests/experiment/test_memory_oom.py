"""An out-of-memory under a memory cap: the user's state identical, the report says why."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import gpudiag as gd
from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.experiment import memory_report as mr
from gpudiag.experiment.trial import GlobalState, TrialSnapshot
from gpudiag.probe import cuda_memory

MIB = 2**20


def test_oom_under_a_cap_restores_everything_and_names_the_category() -> None:
    wl = workloads.get("gpt", seq_len=256, batch_size=4, d_model=64)
    opt = torch.optim.AdamW(wl.model.parameters())
    wl.model(**wl.make_batch()).loss.backward()
    opt.step()  # the user's optimizer has state to keep
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    snap = TrialSnapshot.capture(wl.model, opt)
    rng_before = torch.get_rng_state().clone()
    report = gd.memory(wl, budget="8MiB")
    assert snap.differences() == []
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert snap.globals is not None
    assert GlobalState.capture().differences(snap.globals) == []
    oom = report.oom
    assert oom is not None
    assert oom.budget_bytes == 8 * MIB
    assert oom.asked_bytes > oom.free_bytes  # the request that did not fit
    assert oom.overflowing_category == "activations"
    # what was live when it failed: the parameters and optimizer state the step began with
    n_params = sum(p.numel() * 4 for p in wl.model.parameters())
    assert oom.live_bytes["parameters"] == n_params
    assert oom.live_allocations
    assert "gpt.py" in oom.live_allocations[0].site  # the model's own line, not torch's
    text = " ".join(oom.explain())
    assert "asked for" in text
    assert "activations grew past the budget" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["oom"]["overflowing_category"] == "activations"
    assert "out of memory" in report._repr_html_()


def test_a_budget_that_fits_measures_normally() -> None:
    wl = workloads.get("mlp", batch_size=32, hidden=256)
    report = gd.memory(wl, budget=1 << 30, estimate=False)
    assert report.oom is None
    assert report.peak_bytes > 0


def test_accumulation_calls_the_model_more_than_once_under_the_tracker() -> None:
    wl = workloads.get("gpt", seq_len=128, batch_size=4, d_model=64)
    report = gd.memory(wl, fixes=["batch.size:micro_batch=2,accumulation=2"], budget="1GiB")
    assert report.oom is None
    assert report.estimate is not None
    assert report.estimate.batch_size == 2  # estimated at the micro-batch
    assert report.estimate.peak_bytes == pytest.approx(report.peak_bytes, rel=0.1)


def test_budget_parsing() -> None:
    assert mr.parse_budget("512MiB") == 512 * MIB
    assert mr.parse_budget("2 GB") == 2_000_000_000
    assert mr.parse_budget(1024) == 1024
    assert mr.parse_budget(None) is None
    for bad in ("lots", "-5MiB", 0, [1]):
        with pytest.raises(GpuDiagError):
            mr.parse_budget(bad)


class _FakeOom(RuntimeError):
    pass


def test_cuda_oom_text_and_allocator_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CUDA OOM message and memory_stats are faked (untested on a real GPU)."""
    stats = cuda_memory.AllocatorStats(
        allocated_bytes=30 * 2**30,
        reserved_bytes=70 * 2**30,
        peak_allocated_bytes=60 * 2**30,
        peak_reserved_bytes=70 * 2**30,
        active_bytes=30 * 2**30,
        inactive_split_bytes=20 * 2**30,
        num_alloc_retries=3,
        num_ooms=1,
    )
    monkeypatch.setattr(mr, "allocator_stats", lambda device=None: stats)
    exc = _FakeOom(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 "
        "GiB of which 1.23 GiB is free. Process 1234 has 77.90 GiB memory in use."
    )
    oom = mr.cuda_oom(exc, None)
    assert oom.asked_bytes == 2 * 2**30
    assert oom.free_bytes == int(1.23 * 2**30)
    assert any("expandable_segments:True" in n for n in oom.notes)


def test_allocator_stats_reads_torch_cuda_memory_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake of torch.cuda with the real key names of torch.cuda.memory_stats()."""
    monkeypatch.setattr(cuda_memory.cuda, "available", lambda: True)
    keys = {
        "allocated_bytes.all.current": 100,
        "reserved_bytes.all.current": 400,
        "allocated_bytes.all.peak": 300,
        "reserved_bytes.all.peak": 400,
        "active_bytes.all.current": 120,
        "inactive_split_bytes.all.current": 50,
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(keys))
    stats = cuda_memory.allocator_stats()
    assert stats is not None
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.num_alloc_retries) == (100, 400, 2)
    assert stats.reserved_unused_bytes == 300
    monkeypatch.setattr(cuda_memory.cuda, "available", lambda: False)
    assert cuda_memory.allocator_stats() is None
    assert cuda_memory.allocator_snapshot() is None
