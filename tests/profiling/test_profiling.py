"""``gd.profile`` and ``%%gpudiag profile`` on this machine's CPU, for real.

The CUDA branch (CUDA activity, synchronising before the last step) is only checked with a
fake torch.profiler here: untested on a real GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.analysis.trace import TraceReport
from gpudiag.errors import GpuDiagError
from gpudiag.profiling import profile


def _loop() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(256, 32)), batch_size=8
    )
    batches = iter(data)

    def train_step() -> float:
        (x,) = next(batches)
        loss = model(x).square().mean()
        loss.backward()
        return loss.item()  # a host sync on a GPU

    return train_step


def test_profile_a_step_function(tmp_path: Path) -> None:
    report = profile(_loop(), steps=3, warmup=1, wait=1, trace_dir=tmp_path)
    assert isinstance(report, TraceReport)
    (saved,) = tmp_path.glob("train_step.*.pt.trace.json.gz")
    assert report.rank().path == str(saved)
    assert len(report.steps()) == 3
    assert "3 steps" in report.rank().window  # every profiled step is kept
    assert not report.has_gpu_events
    assert any("CPU-only" in n for n in report.notes)
    assert report.dataloader_share is not None
    assert 0 < report.dataloader_share < 1
    names = {op.name for op in report.top_cpu_ops(50)}
    assert "aten::addmm" in names or "aten::linear" in names
    syncs = report.syncs()
    assert len(syncs) == 3  # one .item() per profiled step
    assert all(s.call_site and "test_profiling.py" in s.call_site for s in syncs)


def test_profile_passes_arguments_and_propagates_errors(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []

    def step(a: int, *, b: int) -> None:
        calls.append((a, b))

    profile(step, 1, b=2, steps=2, warmup=1, trace_dir=tmp_path, with_stack=False)
    assert calls == [(1, 2)] * 3

    def broken() -> None:
        raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError, match="user bug"):
        profile(broken, steps=1, trace_dir=tmp_path)


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"warmup": -1}, {"wait": 1.5}, {"steps": True}])
def test_profile_rejects_bad_counts(kwargs: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(GpuDiagError, match="must be an integer"):
        profile(lambda: None, trace_dir=tmp_path, **kwargs)


def test_profile_rejects_a_non_callable(tmp_path: Path) -> None:
    with pytest.raises(GpuDiagError, match="needs a function"):
        profile(42, trace_dir=tmp_path)  # type: ignore[arg-type]


def test_profile_asks_for_cuda_activity_when_cuda_is_present(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fake: the real library on a CPU build cannot record CUDA (untested on a real GPU)."""
    import torch.profiler

    from gpudiag.profiling import capture

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_profile(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(capture.cuda, "available", lambda: True)
    monkeypatch.setattr(torch.profiler, "profile", fake_profile)
    with pytest.raises(Stop):
        profile(lambda: None, steps=2, trace_dir=tmp_path)
    assert torch.profiler.ProfilerActivity.CUDA in seen["activities"]
    assert seen["record_shapes"]
    assert seen["profile_memory"]
    assert seen["with_stack"]


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


def test_profile_cell_magic(ip: Any, tmp_path: Path) -> None:
    ip.user_ns["runs"] = 0
    ip.user_ns["w"] = torch.randn(16, 16)
    cell = "runs += 1\ny = (w @ w).sum()\nvalue = y.item()\n"
    report = ip.run_cell_magic(
        "gpudiag", f"profile --steps 2 --warmup 1 --trace-dir {tmp_path}", cell
    )
    assert isinstance(report, TraceReport)
    assert ip.user_ns["runs"] == 3  # warm-up + 2 profiled runs, in the user's namespace
    assert len(report.steps()) == 2
    assert any(op.name == "aten::mm" for op in report.top_cpu_ops(20))
    assert len(report.syncs()) == 2


def test_profile_magic_needs_a_cell(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gpudiag", "profile") is None
    assert "cell magic" in capsys.readouterr().out


def test_profile_cell_magic_shows_a_finished_bar_unless_tqdm_is_disabled(
    ip: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ip.user_ns["w"] = torch.randn(8, 8)
    magic = f"profile --steps 2 --warmup 1 --trace-dir {tmp_path}"
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    ip.run_cell_magic("gpudiag", magic, "y = (w @ w).sum()\n")
    err = capsys.readouterr().err
    assert "gpudiag profile: 100%" in err
    assert "3/3" in err
    monkeypatch.setenv("TQDM_DISABLE", "1")
    ip.run_cell_magic("gpudiag", magic, "y = (w @ w).sum()\n")
    assert "gpudiag profile" not in capsys.readouterr().err
