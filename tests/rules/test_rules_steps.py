"""steps.per_step_overhead over measured batch scaling: thresholds, noise, busy hosts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpudiag.experiment.batch_scaling import BatchScaling
from gpudiag.fixes import Fix
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity

CPU_WORKLOAD = SimpleNamespace(device_type="cpu")


def _run(scaling: BatchScaling | None, workload: object = CPU_WORKLOAD) -> list:
    evidence = EvidenceBundle(batch_scaling=scaling, workload=workload, env={})
    return list(run_rules(evidence, only=["steps.per_step_overhead"]).findings)


def _scaling(t1: float, t2: float, **kw: object) -> BatchScaling:
    return BatchScaling(2, 8, t1, t2, ((t1, t2),) * 3, **kw)  # type: ignore[arg-type]


def test_a_step_that_barely_grows_with_the_batch_is_high() -> None:
    (finding,) = _run(_scaling(0.010, 0.011))  # 4x the samples for 1.1x the time
    assert finding.severity is Severity.HIGH
    assert finding.fix is not None
    assert finding.fix == Fix("batch.size", micro_batch=8)
    assert finding.estimated_gain is not None
    assert abs(finding.estimated_gain - (1 - 0.011 / 0.040)) < 1e-9


def test_between_the_thresholds_is_reported_by_its_gain_and_a_linear_step_is_quiet() -> None:
    (found,) = _run(_scaling(0.010, 0.022))  # fixed share 0.6
    # Batch 8 runs 4x the work in 2.2x the time: 45 % less time per sample, HIGH (README:
    # severity follows the gain, HIGH from 10 %), though the fixed share is under the rule's
    # own high line.
    assert found.estimated_gain == pytest.approx(1 - 2.2 / 4)
    assert found.severity is Severity.HIGH
    assert _run(_scaling(0.010, 0.037)) == []  # fixed share 0.1: the work grows with the batch


def test_one_round_against_it_is_enough_to_stay_quiet() -> None:
    noisy = BatchScaling(2, 8, 0.010, 0.011, ((0.010, 0.011), (0.010, 0.035), (0.010, 0.011)))
    assert noisy.fixed_share > 0.9
    assert _run(noisy) == []


def test_a_larger_batch_that_ran_faster_is_noise_not_a_fixed_cost() -> None:
    # Seen on a loaded 2-core host: batch 32 at 117 ms, batch 128 at 1.9 ms in one round.
    disturbed = BatchScaling(2, 8, 0.117, 0.0019, ((0.117, 0.0019), (0.010, 0.011), (0.010, 0.011)))
    assert disturbed.fixed_share_low > 0.9  # the line through the points calls it all fixed
    diagnosis = run_rules(
        EvidenceBundle(batch_scaling=disturbed, workload=CPU_WORKLOAD, env={}),
        only=["steps.per_step_overhead"],
    )
    assert diagnosis.findings == ()
    (skipped,) = diagnosis.not_evaluated
    assert "ran faster than batch 2" in skipped.missing


def test_a_busy_host_turns_cpu_timings_into_a_low_finding_without_a_gain() -> None:
    (finding,) = _run(_scaling(0.010, 0.011, load_average=6.0, cpus=2))
    assert finding.severity is Severity.LOW
    assert finding.estimated_gain is None
    assert any("load average" in e.name for e in finding.evidence)
    gpu = SimpleNamespace(device_type="cuda")  # GPU timings are not distorted by host load
    (on_gpu,) = _run(_scaling(0.010, 0.011, load_average=6.0, cpus=2), workload=gpu)
    assert on_gpu.severity is Severity.HIGH


def test_without_a_measurement_the_rule_says_what_is_missing() -> None:
    diagnosis = run_rules(EvidenceBundle(env={}), only=["steps.per_step_overhead"])
    (skipped,) = diagnosis.not_evaluated
    assert "two batch sizes" in skipped.missing
