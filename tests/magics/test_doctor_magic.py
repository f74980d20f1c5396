"""`%%gpudiag doctor` on the notebook's own training step, and the demo said out loud."""

from __future__ import annotations

import html
from typing import Any

import pytest
import torch

from gpudiag.rules import Diagnosis
from gpudiag.ui.diagnosis import DiagnosisView

pytestmark = pytest.mark.slow

STEP = (
    "opt.zero_grad()\n"
    "loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "loss.backward()\n"
    "opt.step()\n"
    "print('step!')\n"
)


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ipython_shell.user_ns.update(
        torch=torch,
        model=model,
        opt=torch.optim.Adam(model.parameters(), lr=1e-2),
        x=torch.randn(64, 32),
        y=torch.randint(0, 4, (64,)),
        loss="the user's own value",
    )
    return ipython_shell


def test_cell_form_diagnoses_the_cell_and_leaves_the_notebook_as_it_was(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    model, opt = ip.user_ns["model"], ip.user_ns["opt"]
    weights = [p.detach().clone() for p in model.parameters()]
    view = ip.run_cell_magic("gpudiag", "doctor --steps 2 --no-scaling", STEP)
    assert isinstance(view, DiagnosisView)
    diagnosis = view.diagnosis
    assert "trace" in diagnosis.sources
    assert diagnosis.workload.model is model  # the notebook's model, found by the cell's names
    assert diagnosis.workload.optimizer is opt
    # The profiled steps ran the user's cell: its matmuls are in the trace.
    names = {o.name for o in diagnosis.trace.top_cpu_ops(200)}
    assert names & {"aten::addmm", "aten::mm", "aten::linear"}
    # ... and undid them: parameters, optimizer state and the notebook's variables.
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    assert not opt.state
    assert ip.user_ns["loss"] == "the user's own value"
    out = capsys.readouterr().out
    assert "step!" not in out
    assert "demo" not in out
    assert "the cell as your training step" in view.children[1].value


def test_try_it_on_the_cell_keeps_the_notebook_variables(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpudiag.fixes.control import NoChange
    from gpudiag.fixes.spec import registered

    view = ip.run_cell_magic("gpudiag", "doctor --steps 1 --no-scaling --no-widget", STEP)
    assert isinstance(view, Diagnosis)
    # A fix that changes nothing, provably (the cell has no attention for attention.backend to
    # reach: that arm would be "not applied" and never run).
    with registered(NoChange):
        result = view.try_fix(
            "control.none", min_rounds=3, max_rounds=3, time_budget_s=5, progress=False
        )
    arm = result.arm("control.none")
    assert arm.verified
    assert arm.step_time.n >= 1  # the cell ran as the step
    assert ip.user_ns["loss"] == "the user's own value"  # each run of the cell put it back
    assert "step!" not in capsys.readouterr().out


def test_the_cell_form_takes_no_workload(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_cell_magic("gpudiag", "doctor --workload mlp", STEP) is None
    assert "diagnoses its cell" in capsys.readouterr().out


def test_without_a_workload_the_first_line_names_the_demo(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    view = ip.run_line_magic("gpudiag", "doctor --steps 1 --no-scaling")
    first = capsys.readouterr().out.splitlines()[0]
    assert "built-in demo workload 'mlp'" in first
    assert "%%gpudiag doctor" in first
    assert "gd.Workload(" in first
    # The card says so too, above the findings.
    note = html.unescape(view.children[1].value)
    assert "built-in demo workload 'mlp'" in note
    assert "not your code" in note


def test_a_cell_that_fails_is_a_clear_error_and_changes_nothing(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ip.user_ns["model"]
    weights = [p.detach().clone() for p in model.parameters()]
    broken = STEP.replace("loss.backward()", "loss.backward()\nundefined_thing += 1")
    assert ip.run_cell_magic("gpudiag", "doctor --steps 1 --no-scaling", broken) is None
    out = capsys.readouterr().out
    assert "gpudiag: the cell failed when run as a training step: NameError" in out
    assert "undefined_thing" in out
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    assert ip.user_ns["loss"] == "the user's own value"


def test_gpudiag_bugs_are_not_blamed_on_the_cell(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpudiag.doctor

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("inside gpudiag")

    monkeypatch.setattr(gpudiag.doctor, "diagnose", broken)
    with pytest.raises(RuntimeError, match="inside gpudiag"):
        ip.run_cell_magic("gpudiag", "doctor --steps 1 --no-scaling", STEP)
