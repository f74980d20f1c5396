"""The diagnosis widget: a "Try it" button per fixable finding runs the comparison beside it."""

from __future__ import annotations

from typing import Any

from gpudiag._progress import ProgressBar
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
    bar = options.pop("progress")
    assert options == {"time_budget_s": 5}
    # The bar is drawn in the finding's own output (a button callback has no cell).
    assert isinstance(bar, ProgressBar)
    assert bar.output is view.outputs[0]
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
        Finding(
            "batch",
            Severity.HIGH,
            "steps",
            "tiny batch",
            fix=FixRef("batch.size", {"micro_batch": 16}),
        ),
        Finding("batch.bare", Severity.LOW, "steps", "no size", fix=FixRef("batch.size")),
    )
    view = DiagnosisView(Diagnosis(findings, (), (), (), workload=object()))
    advice, env, batch, bare = view.buttons
    assert advice.disabled
    assert "advice only" in advice.tooltip
    assert env.disabled
    assert "new process" in env.tooltip
    assert not batch.disabled  # batch.size runs in trials
    # Without a size it would measure a copy of the baseline: it says what to give instead.
    assert bare.disabled
    assert bare.tooltip.startswith("batch.size needs a size: give batch.size=N")


def _timed_step(clock: Any, bf16_factor: float) -> Any:
    """A step that "takes" 10 ms on the fake clock, ``bf16_factor`` times that under autocast."""
    import torch

    from gpudiag.experiment.workload import Workload

    ones = torch.ones(2, 2)

    def step() -> float:
        torch.mm(ones, ones)  # a matrix product bf16 autocast is seen to reach (its proof)
        fast = torch.is_autocast_enabled("cpu")
        clock.advance(0.010 * (bf16_factor if fast else 1.0))
        return 1.0

    return Workload.from_step(step, name="timed")


def _tried_view(clock: Any, system: Any, bf16_factor: float) -> DiagnosisView:
    findings = (
        Finding(
            "precision.cpu_fp32_with_bf16",
            Severity.MEDIUM,
            "precision",
            "fp32 on a bf16 CPU",
            fix=FixRef("precision.bf16"),
        ),
    )
    diagnosis = Diagnosis(
        findings, (), (), (), workload=_timed_step(clock, bf16_factor), system=system
    )
    view = DiagnosisView(
        diagnosis, clock=clock, measure_memory=False, steps_per_sample=1, min_rounds=5
    )
    view.buttons[0].click()
    return view


def test_a_fix_measured_slower_is_marked_and_stops_recommending_itself(
    fake_clock: Any, bf16_cpu: Any
) -> None:
    view = _tried_view(fake_clock, bf16_cpu, bf16_factor=1 / 0.6)
    outcome = view.outcomes[0]
    assert not outcome.helped
    assert outcome.verdict == "slower"
    card = view.cards[0].value
    assert "tried, did not help" in card
    assert "measured slower here: 0.60x" in card
    assert "next: try precision.bf16" not in card  # no longer recommends itself
    assert "did not help here" in card
    assert view.buttons[0].button_style == "warning"


def test_a_fix_measured_no_different_is_marked_too(fake_clock: Any, bf16_cpu: Any) -> None:
    view = _tried_view(fake_clock, bf16_cpu, bf16_factor=1.0)
    assert view.outcomes[0].verdict == "no significant difference"
    assert "tried, did not help" in view.cards[0].value
    assert "next: try precision.bf16" not in view.cards[0].value


def test_a_fix_measured_faster_keeps_its_advice_with_the_figure(
    fake_clock: Any, bf16_cpu: Any
) -> None:
    view = _tried_view(fake_clock, bf16_cpu, bf16_factor=0.5)
    assert view.outcomes[0].helped
    card = view.cards[0].value
    assert "tried, helped" in card
    assert "measured faster here: 2.00x" in card
    assert "next: try precision.bf16" in card
    # The comparison is shown below the finding as its figure above its table.
    figure, table = view.shown[0].children
    assert [d.type for d in figure.data] == ["box", "box", "scatter"]
    assert "precision.bf16" in table.value


def test_findings_are_full_width_with_the_comparison_below() -> None:
    view = DiagnosisView(_diagnosis(workload=object()))
    row = view.children[1]
    assert type(row).__name__ == "VBox"  # card, button, output stacked: no side column
    card, button, out = row.children
    assert button is view.buttons[0]
    assert card.layout.width == out.layout.width == "100%"
    assert row.layout.width == "100%"
    assert "flex" not in str(card.layout.flex or "")


def test_buttons_use_the_cli_spelling_of_a_fix() -> None:
    findings = (
        Finding(
            "attention.sdpa_math_fallback",
            Severity.HIGH,
            "attention",
            "math attention",
            fix=FixRef("attention.backend", {"backend": "flash"}),
        ),
    )
    view = DiagnosisView(Diagnosis(findings, (), (), (), workload=object()))
    assert view.buttons[0].description == "Try attention.backend=flash"
    assert "next: try attention.backend=flash" in view.cards[0].value
    from gpudiag.fixes import Fix

    assert Fix.parse("attention.backend=flash") == findings[0].fix.to_fix()


def test_a_fix_that_could_not_be_applied_live_keeps_the_findings_advice(bf16_cpu: Any) -> None:
    # A newcomer's model with attention written by hand: attention.backend cannot reach it.
    # The card used to say "keep it as it is: attention.backend did not help here".
    import torch

    from gpudiag.experiment.workload import Workload
    from tests.fixes.test_fix_proofs import Blocks, HandAttention

    model = Blocks(HandAttention)
    workload = Workload(
        model,
        batch=torch.randn(2, 8, 16),
        loss=lambda m, b: m(b).square().mean(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        batch_size=2,
    )
    findings = (
        Finding(
            "attention.hand_written",
            Severity.MEDIUM,
            "attention",
            "softmax between matmuls",
            fix=FixRef("attention.backend", {"backend": "flash"}),
            instruction="use a fused attention kernel",
        ),
    )
    diagnosis = Diagnosis(findings, (), (), (), workload=workload, system=bf16_cpu)
    view = DiagnosisView(diagnosis, measure_memory=False, max_rounds=3, min_rounds=2, drift_steps=1)
    view.buttons[0].click()
    outcome = view.outcomes[0]
    assert (outcome.verdict, outcome.helped, outcome.retracts) == ("not applied", False, False)
    card = view.cards[0].value
    assert "tried, could not be applied live" in card
    assert "could not be applied live: the model computes attention by hand" in card
    assert "scaled_dot_product_attention(q, k, v" in card  # the change to make by hand
    assert "next: try attention.backend=flash: use a fused attention kernel" in card
    assert "did not help here" not in card
    assert view.buttons[0].button_style == "warning"
