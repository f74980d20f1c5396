"""In a terminal IPython (no widget front end) every result and every widget a call returns
shows its text report, never ``DiagnosisView(children=(HTML(value=...``."""

from __future__ import annotations

from typing import Any

import pytest

WIDGET_REPR = "(children=("


@pytest.fixture
def terminal(ipython_shell: Any) -> Any:
    """The in-process shell as a terminal IPython: it shows text/plain only."""
    active = ipython_shell.display_formatter.active_types
    ipython_shell.display_formatter.active_types = ["text/plain"]
    yield ipython_shell
    ipython_shell.display_formatter.active_types = active


def _shown(terminal: Any, capsys: pytest.CaptureFixture[str], code: str) -> str:
    capsys.readouterr()
    result = terminal.run_cell(code)
    assert result.error_in_exec is None, result.error_in_exec
    return capsys.readouterr().out


@pytest.mark.slow
def test_the_doctor_card_shows_its_text_report(
    terminal: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _shown(terminal, capsys, "%gpudiag doctor --workload mlp --no-scaling --steps 1")
    assert WIDGET_REPR not in out
    assert "gpudiag diagnose:" in out
    assert "step time " in out  # the report as gd.diagnose prints it
    assert "diagnosing the built-in demo workload 'mlp'" in out


def test_the_occupancy_explorer_shows_its_result(
    terminal: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _shown(terminal, capsys, "%gpudiag occupancy --cc 8.0 --threads 256 --regs 64")
    assert WIDGET_REPR not in out
    assert "Occupancy(cc 8.0, 256 threads, 64 regs, 0 B smem: 50.0% occupancy" in out


def test_a_monitor_shows_its_status(terminal: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = _shown(
        terminal,
        capsys,
        "import gpudiag as gd\nm = gd.monitor(interval=0.2, replay='demo')\nm.stop()\nm",
    )
    assert WIDGET_REPR not in out
    assert "<Monitor stopped: recording: demo cluster" in out
    assert "m.summary()" in out


def test_every_result_type_shows_text(
    terminal: Any, capsys: pytest.CaptureFixture[str], fake_clock: Any
) -> None:
    from gpudiag.experiment.compare import compare
    from gpudiag.step import Workload
    from gpudiag.ui.diagnosis import DiagnosisView
    from gpudiag.ui.figures import comparison_view

    def step() -> float:
        fake_clock.advance(0.01)
        return 1.0

    comparison = compare(
        Workload.from_step(step),
        ["attention.backend=math"],
        clock=fake_clock,
        progress=False,
        measure_memory=False,
        steps_per_sample=1,
    )
    terminal.user_ns.update(comparison=comparison, view=comparison_view(comparison))
    out = _shown(terminal, capsys, "comparison")
    assert repr(comparison) in out
    assert WIDGET_REPR not in _shown(terminal, capsys, "view")
    import gpudiag as gd

    terminal.user_ns["diagnosis"] = gd.diagnose(system=gd.inspect(), progress=False)
    terminal.user_ns["card"] = DiagnosisView(terminal.user_ns["diagnosis"])
    for name in ("diagnosis", "card"):
        out = _shown(terminal, capsys, name)
        assert WIDGET_REPR not in out
        assert "gpudiag diagnose:" in out
    for code in (
        "gd.inspect()",
        "gd.occupancy((8, 0), threads_per_block=256, regs_per_thread=64)",
        "gd.plan('llama3-8b', gpus=8, seq_len=8192, global_batch=64)",
    ):
        out = _shown(terminal, capsys, code)
        assert out.strip()
        assert WIDGET_REPR not in out
