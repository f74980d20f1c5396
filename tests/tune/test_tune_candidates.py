"""What gd.tune tries: candidates from the evidence, values worth trying, what is skipped."""

from __future__ import annotations

from typing import Any

from gpudiag.experiment.estimate import estimate_memory
from gpudiag.fixes import Fix
from gpudiag.rules.engine import Diagnosis
from gpudiag.rules.finding import Finding, Severity
from gpudiag.tune.candidates import from_evidence, usable_cores
from gpudiag.workloads import input_bound, mlp


def _labels(cands: list[Any]) -> list[str]:
    return [c.label for c in cands]


def test_a_dataloader_a_small_batch_and_a_model_give_their_values(bf16_cpu: Any) -> None:
    wl = input_bound.build(batch_size=4)
    cands, skipped = from_evidence(wl, None, system=bf16_cpu, device_type="cpu")
    labels = _labels(cands)
    assert {"batch.size=8", "batch.size=16", "batch.size=32", "compile"} <= set(labels)
    workers = sorted(c.fix.params["num_workers"] for c in cands if c.fix.id == "dataloader.tuning")
    assert workers == sorted({max(1, usable_cores() // 2), usable_cores()})
    # On the CPU nothing is pinned (pinned memory is for copies to a GPU).
    assert all(not c.fix.params["pin_memory"] for c in cands if c.fix.id == "dataloader.tuning")
    loader = next(c for c in cands if c.fix.id == "dataloader.tuning")
    assert "num_workers=0" in loader.source
    assert skipped == []


def test_batch_sizes_over_the_memory_budget_are_skipped_with_the_estimate(
    bf16_cpu: Any,
) -> None:
    wl = mlp.build(batch_size=4, hidden=32, in_features=16)
    budget = int(estimate_memory(wl, progress=False).at_batch(16) / 0.8) + 1
    cands, skipped = from_evidence(
        wl, None, system=bf16_cpu, device_type="cpu", memory_budget=budget
    )
    assert "batch.size=16" in _labels(cands)
    assert "batch.size=32" not in _labels(cands)
    (label, why), *_ = skipped
    assert label == "batch.size=32"
    assert "over 80% of the memory budget" in why


def test_the_diagnosis_recommendations_and_the_users_set(bf16_cpu: Any) -> None:
    wl = mlp.build(batch_size=4, hidden=32, in_features=16)
    found = Finding(
        "steps.per_step_overhead", Severity.HIGH, "steps", "fixed cost",
        fix=Fix("batch.size", micro_batch=64), rule="steps.per_step_overhead",
    )  # fmt: skip
    info = Finding("x.info", Severity.INFO, "x", "fyi", fix=Fix("compile"), rule="x.info")
    diagnosis = Diagnosis(findings=(found, info), not_evaluated=(), evaluated=())
    cands, _ = from_evidence(wl, diagnosis, system=bf16_cpu, device_type="cpu", fixes=None)
    first = cands[0]
    assert first.label == "batch.size=64"
    assert first.source == "diagnosis: steps.per_step_overhead"
    # The user's set narrows: only these, an id without values expanded; environment and
    # advice fixes are skipped with the reason; fixes already tried are left out.
    cands, skipped = from_evidence(
        wl, None, system=bf16_cpu, device_type="cpu",
        fixes=["batch.size", "allocator.config:expandable_segments=true", "precision.bf16"],
        tried=[Fix("batch.size", micro_batch=8)],
    )  # fmt: skip
    assert _labels(cands) == ["batch.size=16", "batch.size=32", "precision.bf16"]
    assert dict(skipped)["allocator.config"].startswith("environment fixes need a new process")


def test_checkpointing_is_a_candidate_only_when_memory_binds(bf16_cpu: Any) -> None:
    wl = mlp.build(batch_size=4, hidden=32, in_features=16)
    peak = estimate_memory(wl, progress=False).peak_bytes
    roomy, _ = from_evidence(wl, None, system=bf16_cpu, device_type="cpu", memory_budget=2 * peak)
    assert "activation.checkpointing" not in _labels(roomy)
    tight, skipped = from_evidence(
        wl, None, system=bf16_cpu, device_type="cpu", memory_budget=peak // 2
    )
    ckpt = next(c for c in tight if c.fix.id == "activation.checkpointing")
    assert ckpt.source.startswith("memory: estimated peak")
    # No batch size fits under a budget the workload's own batch is over.
    assert not [c for c in tight if c.fix.id == "batch.size"]
    assert {label for label, _ in skipped} == {"batch.size=8", "batch.size=16", "batch.size=32"}
