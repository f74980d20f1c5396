"""gd.tune's search on a fake clock: what it keeps, drops, combines and hands back, and why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpudiag.errors import ArgumentError, FixConflictError, GpuDiagError
from gpudiag.fixes import Fix, check_conflicts
from gpudiag.tune import TuneResult, tune
from gpudiag.tune.result import BEST, CONTROL, DROPPED
from tests.tune.tune_world import RAISE, fake_step, world

FAST = ["test.halve", "test.clash", "test.trim"]


@pytest.fixture
def fake_world() -> Any:
    with world():
        yield


def run(clock: Any, system: Any, fixes: list[str], **kw: Any) -> TuneResult:
    options: dict[str, Any] = {
        "system": system,
        "clock": clock,
        "progress": False,
        "diagnosis": False,
        "measure_memory": False,
        "steps_per_sample": 1,
        "time_budget_s": 60.0,
    }
    options.update(kw)
    return tune(fake_step(clock, seed=kw.pop("seed", 0)), fixes=fixes, **options)


def _arm(result: TuneResult, label: str, stage_name: str | None = None) -> Any:
    found = [a for a in result.history if a.label == label and stage_name in (None, a.stage_name)]
    assert found, f"{label} not in {[a.label for a in result.history]}"
    return found[-1]


def test_best_is_the_measured_combination_of_non_conflicting_winners(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    r = run(fake_clock, bf16_cpu, FAST)
    # halve (0.5) and clash (0.6) change the same thing: only the better one goes on;
    # trim (0.7) combines with halve, measured together: 0.35 of the baseline's time.
    assert {f.id for f in r.best.fixes} == {"test.halve", "test.trim"}
    assert r.best.verdict == "faster"
    assert r.best.verified
    assert r.best.applied
    assert r.best.speedup is not None
    assert r.best.speedup.value == pytest.approx(1 / 0.35, rel=0.06)
    assert r.best.versus is not None
    assert r.best.versus.verdict == "faster"
    assert r.best.grew_from == "test.halve"
    clash = _arm(r, "test.clash")
    assert clash.status == DROPPED
    assert "same fix" in clash.reason
    assert [a.label for a in r.path] == ["test.halve", r.best.label]
    assert r.finished
    assert not r.not_reached
    # The recipe holds the best arm's fixes only, each with the evidence it was accepted on.
    recipe = r.recipe()
    assert {e.id for e in recipe.fixes} == {"test.halve", "test.trim"}
    assert all(e.evidence.arm == r.best.label for e in recipe.fixes)
    assert all(e.evidence.verdict == "faster" for e in recipe.fixes)


def test_not_applied_drifting_and_slower_arms_never_win(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    # test.never (0.2) and test.drifts (0.3) would be the fastest; neither may win.
    r = run(fake_clock, bf16_cpu, ["test.never", "test.drifts", "test.slows", "test.trim"])
    assert r.best.label == "test.trim"
    never = _arm(r, "test.never")
    assert never.status == DROPPED
    assert never.reason.startswith("not applied")
    assert never.rounds == 0  # never timed
    drifts = _arm(r, "test.drifts")
    assert drifts.status == DROPPED
    assert "drift" in drifts.reason
    slows = _arm(r, "test.slows")
    assert slows.status == DROPPED
    assert "slower" in slows.reason
    aa = _arm(r, "control.none")
    assert aa.status == CONTROL
    assert all(
        a.applied and a.verdict == "faster" and a.label != "control.none"
        for a in r.history
        if a.status == BEST
    )


def test_an_arm_that_fails_is_dropped_with_its_error_and_the_search_goes_on(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    RAISE["test.boom"] = RuntimeError("the fix broke the step")
    r = run(fake_clock, bf16_cpu, ["test.boom", "test.halve"])
    boom = _arm(r, "test.boom")
    assert boom.status == DROPPED
    assert "RuntimeError: the fix broke the step" in boom.reason
    assert r.best.label == "test.halve"


def test_nothing_faster_leaves_the_baseline_best_and_no_recipe(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    r = run(fake_clock, bf16_cpu, ["test.slows", "test.never"])
    assert r.best.is_baseline
    assert r.best.fixes == ()
    assert "nothing beat the baseline" in repr(r)
    with pytest.raises(GpuDiagError, match="no fix beat the baseline"):
        r.recipe()


def test_the_budget_is_honoured_and_what_is_left_resumes(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    first = run(fake_clock, bf16_cpu, FAST, time_budget_s=0.9)
    # The race ran; the combination would need more than what was left of the budget.
    assert first.elapsed_s <= 0.9 * 1.10
    assert first.not_reached
    assert "combine" in first.not_reached[0]
    assert first.best.label == "test.halve"
    assert any("budget ran out" in n for n in first.notes)
    again = tune(
        fake_step(fake_clock), fixes=FAST, resume=first, system=bf16_cpu, clock=fake_clock,
        progress=False, diagnosis=False, measure_memory=False, steps_per_sample=1,
        time_budget_s=60,
    )  # fmt: skip
    assert {f.id for f in again.best.fixes} == {"test.halve", "test.trim"}
    assert again.finished
    assert not any("budget ran out" in n for n in again.notes)
    assert any(n.startswith("resumed a search") for n in again.notes)
    # The resumed search keeps the first one's history and does not race its arms again.
    assert [a.label for a in again.history[: len(first.history)]] == [
        a.label for a in first.history
    ]
    assert sum(1 for s in again.stages if s.name == "race") == 1


def test_text_html_json_and_plot(fake_clock: Any, bf16_cpu: Any, fake_world: Any) -> None:
    r = run(fake_clock, bf16_cpu, ["test.halve", "test.trim", "test.never"])
    text = repr(r)
    assert "best: test.halve+test.trim" in text
    assert "not applied" in text
    html = r._repr_html_()
    assert "Tune" in html
    assert "<script" not in html
    data = json.loads(json.dumps(r.to_dict()))
    assert data["best"]["label"] == "test.halve+test.trim"
    assert data["path"] == ["test.halve", "test.halve+test.trim"]
    statuses = {a["label"]: a["status"] for a in data["history"]}
    assert statuses["test.never"] == "dropped"
    fig = r.plot()
    path, times = fig.data
    assert list(path.x) == ["baseline", "test.halve", "test.halve+test.trim"]
    assert path.y[0] == 1.0
    assert path.y[-1] == pytest.approx(1 / 0.35, rel=0.06)
    assert len(times.y) == len(r.history)


def test_arguments_are_checked_before_anything_runs(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    with pytest.raises(ArgumentError, match="objective"):
        run(fake_clock, bf16_cpu, FAST, objective="latency")
    with pytest.raises(ArgumentError, match="time_budget_s"):
        run(fake_clock, bf16_cpu, FAST, time_budget_s=float("nan"))
    with pytest.raises(ArgumentError, match="unknown argument"):
        run(fake_clock, bf16_cpu, FAST, rounds=3)
    with pytest.raises(ArgumentError, match="nproc"):
        run(fake_clock, bf16_cpu, FAST, nproc=1)
    with pytest.raises(ArgumentError, match="resume"):
        run(fake_clock, bf16_cpu, FAST, resume="last time")


def test_conflicts_are_declared_on_the_specs() -> None:
    with pytest.raises(FixConflictError, match="both capture CUDA graphs"):
        check_conflicts([Fix("compile", mode="reduce-overhead"), Fix("cuda.graphs")])
    check_conflicts([Fix("compile", mode="default"), Fix("cuda.graphs")])


def test_an_undecided_arm_never_becomes_best(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    # Very noisy steps and a budget that ends the race before its first planned look: the
    # estimates say "faster", the evidence does not yet.
    wl = fake_step(fake_clock, noise=0.9, seed=3)
    r = tune(
        wl, fixes=["test.trim"], system=bf16_cpu, clock=fake_clock, progress=False,
        diagnosis=False, measure_memory=False, steps_per_sample=1, time_budget_s=0.25,
    )  # fmt: skip
    trim = [a for a in r.history if a.label == "test.trim"]
    assert trim
    assert all(a.verdict == "undecided" for a in trim if a.verdict)
    assert r.best.is_baseline
    assert all(a.status != BEST for a in r.history)


def test_the_best_arm_is_re_diagnosed_and_its_advice_combined(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudiag.rules.engine import Diagnosis
    from gpudiag.rules.finding import Finding, Severity

    seen: list[tuple[str, ...]] = []

    def diagnose_arm(workload: Any, fixes: Any, system: Any, device_type: str) -> Diagnosis:
        seen.append(tuple(f.label for f in fixes))
        finding = Finding(
            "fake.next", Severity.MEDIUM, "fake", "the next bottleneck",
            fix=Fix("test.trim"), rule="fake.next",
        )  # fmt: skip
        return Diagnosis(findings=(finding,), not_evaluated=(), evaluated=())

    monkeypatch.setattr("gpudiag.tune.search._diagnose_arm", diagnose_arm)
    r = run(fake_clock, bf16_cpu, ["test.halve"])
    # The race's best is re-diagnosed; what it recommends is combined with it and measured;
    # the new best is re-diagnosed in turn, and with nothing new to try the search ends.
    assert seen == [("test.halve",), ("test.halve", "test.trim")]
    assert r.best.label == "test.halve+test.trim"
    assert r.best.source == "diagnosis: fake.next"
    assert r.next_bottleneck == ("fake.next: the next bottleneck",)
    assert [s.name for s in r.stages].count("re-diagnose") == 2
    assert r.finished


def test_a_fix_slower_alone_is_combined_when_the_best_arms_diagnosis_points_to_it(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # test.after_halve is slower against the baseline and faster once test.halve is in the
    # step (a DataLoader that did not limit a tiny batch limits a large one): the best arm's
    # own diagnosis names it, so it is measured with the best, once.
    from gpudiag.rules.engine import Diagnosis
    from gpudiag.rules.finding import Finding, Severity

    def diagnose_arm(workload: Any, fixes: Any, system: Any, device_type: str) -> Diagnosis:
        finding = Finding(
            "fake.next", Severity.MEDIUM, "fake", "the next bottleneck",
            fix=Fix("test.after_halve"), rule="fake.next",
        )  # fmt: skip
        return Diagnosis(findings=(finding,), not_evaluated=(), evaluated=())

    monkeypatch.setattr("gpudiag.tune.search._diagnose_arm", diagnose_arm)
    r = run(fake_clock, bf16_cpu, ["test.halve", "test.after_halve"])
    assert _arm(r, "test.after_halve", "race").verdict == "slower"
    assert r.best.label == "test.halve+test.after_halve"
    assert [s.name for s in r.stages].count("re-diagnose") == 2
    assert r.finished


def test_multi_rank_fixes_go_to_a_trial_on_ranks_never_beside_the_search(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    # Without nproc, fsdp.wrap is skipped with where it is measured.
    r = run(fake_clock, bf16_cpu, ["fsdp.wrap", "test.halve"])
    assert "nproc=N" in dict(r.skipped)["fsdp.wrap"]
    # With nproc, it goes to the multi-rank trial; a notebook's own step cannot be rebuilt
    # in the ranks, so it is dropped with that reason (before any process starts), and the
    # one-process search goes on.
    r = run(fake_clock, bf16_cpu, ["fsdp.wrap", "test.halve"], nproc=2)
    fsdp = next(a for a in r.history if a.label == "fsdp.wrap")
    assert fsdp.status == DROPPED
    assert fsdp.reason.startswith("not measured on ranks")
    assert fsdp.stage_name == "2 ranks"
    assert r.best.label == "test.halve"
    assert r.finished


def test_fixes_a_spec_declares_in_conflict_are_never_combined(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    r = run(fake_clock, bf16_cpu, ["test.halve", "test.exclusive", "test.trim"])
    pair = _arm(r, "test.halve+test.exclusive")
    assert pair.status == DROPPED
    assert pair.rounds == 0
    assert "cannot go together (the fake world says" in pair.reason
    assert not any(
        a.rounds for a in r.history if {"test.halve", "test.exclusive"} <= {f.id for f in a.fixes}
    )
    assert r.best.label == "test.halve+test.trim"


def test_a_race_takes_the_candidates_the_budget_has_room_for_in_order(
    fake_clock: Any, bf16_cpu: Any, fake_world: Any
) -> None:
    from gpudiag.rules.engine import Diagnosis, StepTime

    # The diagnosis timed a 10 ms step: before any comparison, an arm is reckoned at ten
    # steps of overhead and a round at one step each, to the race's first planned look.
    timed = Diagnosis(
        findings=(), not_evaluated=(), evaluated=(), step_time=StepTime(0.01, "measured")
    )
    r = run(fake_clock, bf16_cpu, FAST, diagnosis=timed, time_budget_s=0.6, min_sample_s=0.01)
    raced = {a.label for a in r.history if a.stage_name == "race"}
    assert raced == {"test.halve", "control.none"}
    assert r.best.label == "test.halve"
    assert r.not_reached[0] == "race test.clash, test.trim"
    assert any("room to race 1 of 3 candidates" in n for n in r.notes)
    assert r.elapsed_s <= 0.6 * 1.10
