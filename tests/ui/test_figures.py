"""Results shown with their figures: a Comparison as plot + table, doctor's time breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.doctor import diagnose
from gpudiag.experiment.compare import compare
from gpudiag.experiment.workload import Workload
from gpudiag.plots.trace import step_time_figure

WIDGET = "application/vnd.jupyter.widget-view+json"
RESNET_W0 = "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"


def _comparison(clock: Any, system: Any, name: str = "fake") -> Any:
    ones = torch.ones(2, 2)

    def step() -> float:
        torch.mm(ones, ones)  # a matrix product bf16 autocast is seen to reach (its proof)
        clock.advance(0.005 if torch.is_autocast_enabled("cpu") else 0.010)
        return 1.0

    return compare(
        Workload.from_step(step, name=name),
        ["precision.bf16"],
        system=system,
        clock=clock,
        progress=False,
        measure_memory=False,
        steps_per_sample=1,
    )


def test_a_comparison_shown_in_ipython_carries_its_figure_and_table(
    ipython_shell: Any, fake_clock: Any, bf16_cpu: Any
) -> None:
    comparison = _comparison(fake_clock, bf16_cpu)
    data, _ = ipython_shell.display_formatter.format(comparison)
    assert WIDGET in data  # figure + table as widgets where the front end has them
    assert "precision.bf16" in data["text/html"]  # the table alone where it has not
    assert data["text/plain"].startswith("Comparison on")


def test_the_comparison_figure_escapes_what_the_user_named(fake_clock: Any, bf16_cpu: Any) -> None:
    from gpudiag.ui.figures import comparison_view

    view = comparison_view(_comparison(fake_clock, bf16_cpu, name="<img src=x onerror=alert(1)>"))
    figure, table = view.children
    assert "<img" not in figure.layout.title.text
    assert "&lt;img" in figure.layout.title.text
    assert "<img" not in table.value
    speedup = next(d for d in figure.data if d.type == "scatter")
    assert list(speedup.x) == pytest.approx([2.0])


def test_a_gpu_trace_shows_its_time_ledger(fixtures_dir: Path) -> None:
    # The doctor card opens with where the step's time goes: the time ledger, largest row on
    # top (before issue 21: the GPU time breakdown's one stacked bar).
    from gpudiag.analysis.trace import analyze_trace

    report = analyze_trace(fixtures_dir / "traces" / RESNET_W0)
    figure = step_time_figure(report)
    assert figure.layout.title.text.startswith("where the step&#x27;s time goes")
    (bars,) = figure.data
    assert sum(bars.x) == pytest.approx(100.0, abs=0.01)  # every microsecond, once
    assert list(bars.x) == sorted(bars.x)  # drawn bottom-up: the largest row on top
    assert bars.y[-1] == report.ledger().rows[0].label


@pytest.mark.slow
def test_doctor_shows_where_a_cpu_step_goes_above_its_findings() -> None:
    from gpudiag.magics.doctor import doctor_view

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    workload = Workload(
        model,
        batch=lambda n: (torch.randn(n, 64), torch.randint(0, 8, (n,))),
        loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        batch_size=32,
    )
    diagnosis = diagnose(workload, steps=2, scaling=False, env={})
    figure = step_time_figure(diagnosis.trace)
    rows = {bar.y[0] for bar in figure.data}
    assert rows == {"by phase", "by operator"}
    for row in rows:  # each bar is the whole step
        total = sum(bar.x[0] for bar in figure.data if bar.y[0] == row)
        assert total == pytest.approx(100.0, abs=0.5)
    phases = {bar.name: bar.x[0] for bar in figure.data if bar.y[0] == "by phase"}
    assert phases["backward (autograd)"] > 0  # read from the trace's autograd operators
    operators = [bar.name for bar in figure.data if bar.y[0] == "by operator"]
    assert any(name.startswith("aten::") for name in operators)
    view = doctor_view(diagnosis, note="what was diagnosed")
    header, note, shown, *findings = view.children
    assert "gpudiag diagnose" in header.value
    assert "what was diagnosed" in note.value
    assert [d.name for d in shown.data] == [d.name for d in figure.data]
    assert len(findings) >= len(diagnosis.findings)


def test_gd_compare_in_ipython_registers_the_figure_without_load_ext(
    ipython_shell: Any, fake_clock: Any, bf16_cpu: Any
) -> None:
    import gpudiag
    from gpudiag.ui.figures import register_displays, unregister_displays

    comparison = _comparison(fake_clock, bf16_cpu)
    unregister_displays(ipython_shell)
    try:
        data, _ = ipython_shell.display_formatter.format(comparison)
        assert WIDGET not in data  # the table alone
        gpudiag.__getattr__("compare")  # what `gd.compare` does on first use
        data, _ = ipython_shell.display_formatter.format(comparison)
        assert WIDGET in data
    finally:
        register_displays(ipython_shell)
