"""The diagnosis widget: a "Try it" button per fixable finding runs the comparison beside it."""

from __future__ import annotations

from typing import Any

from gpudiag.rules.engine import Diagnosis
from gpudiag.rules.finding import Finding, FixRef, Severity
from gpudiag.ui.diagnosis import DiagnosisView


def _diagnosis(workload: Any) -> Diagnosis:
    findings = (
        Finding(
            "precision.fp32",
            Severity.HIGH,
            "precision",
            "fp32 matmuls",
            fix=FixRef("precision.bf16"),
        ),
        Finding(
            "hw.persistence_off",
            Severity.LOW,
            "hardware",
            "persistence off",
            instruction="nvidia-smi -pm 1",
        ),
    )
    return Diagnosis(findings, (), ("a", "b"), ("trace",), workload=workload)


def test_only_fixable_findings_get_a_button() -> None:
    view = DiagnosisView(_diagnosis(workload=object()))
    assert [b.description for b in view.buttons] == ["Try precision.bf16"]
    assert not view.buttons[0].disabled


def test_clicking_runs_the_fix_and_shows_the_result(monkeypatch: Any) -> None:
    diagnosis = _diagnosis(workload=object())
    seen: list[tuple[Any, dict[str, Any]]] = []

    def fake_try_fix(fix: Any, **options: Any) -> str:
        seen.append((fix, options))
        return "comparison result"

    monkeypatch.setattr(Diagnosis, "try_fix", lambda self, fix, **o: fake_try_fix(fix, **o))
    view = DiagnosisView(diagnosis, time_budget_s=5)
    view.buttons[0].click()
    ((fix, options),) = seen
    assert fix.id == "precision.bf16"
    assert options == {"progress": False, "time_budget_s": 5}
    assert view.results == {0: "comparison result"}
    assert "again" in view.buttons[0].description
    assert not view.buttons[0].disabled


def test_without_a_workload_the_button_is_disabled_and_says_why() -> None:
    view = DiagnosisView(_diagnosis(workload=None))
    assert view.buttons[0].disabled
    assert "gd.diagnose(workload=" in view.buttons[0].tooltip


def test_a_user_error_is_shown_not_raised() -> None:
    diagnosis = _diagnosis(workload=None)
    view = DiagnosisView(diagnosis)
    assert view.try_finding(0) is None  # the real try_fix raises: no workload
    assert view.results == {}


def test_a_fix_that_cannot_run_live_is_disabled_with_its_reason() -> None:
    findings = (
        Finding(
            "sync.host_sync_in_step",
            Severity.MEDIUM,
            "synchronisation",
            ".item() in the step",
            fix=FixRef("sync.remove", {"call_site": "train.py(12): step"}),
        ),
        Finding("env.x", Severity.LOW, "environment", "x", fix=FixRef("allocator.config")),
        Finding("batch", Severity.HIGH, "steps", "tiny batch", fix=FixRef("batch.size")),
    )
    view = DiagnosisView(Diagnosis(findings, (), (), (), workload=object()))
    advice, env, batch = view.buttons
    assert advice.disabled
    assert "advice only" in advice.tooltip
    assert env.disabled
    assert "new process" in env.tooltip
    assert not batch.disabled  # batch.size runs in trials
