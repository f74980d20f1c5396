"""Recipe.apply re-checks the machine; Comparison.recipe keeps what helped, with evidence."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from gpudiag.experiment.compare import compare
from gpudiag.experiment.workload import Workload
from gpudiag.recipe import Recipe


def test_apply_skips_what_this_machine_cannot_do(make_cpu_system: Any) -> None:
    recipe = Recipe.of(["precision.bf16", "precision.tf32", "fsdp.wrap", "allocator.config"])
    model = nn.Linear(4, 4)
    applied = recipe.apply(model, system=make_cpu_system("avx512_bf16"))
    try:
        assert [f.id for f in applied.fixes] == ["precision.bf16"]
        skipped = {f.id: why for f, why in applied.skipped}
        assert "TF32" in skipped["precision.tf32"]
        assert "nproc=2" in skipped["fsdp.wrap"]
        assert "PYTORCH_CUDA_ALLOC_CONF" in skipped["allocator.config"]
        assert "skipped" in repr(applied)
        assert model(torch.randn(1, 4)).dtype == torch.float32
    finally:
        applied.revert()
    assert "forward" not in vars(model)


def test_environment_fix_counts_as_applied_when_already_set(
    make_cpu_system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = Recipe.of(["nccl.env:NCCL_ALGO=Ring"])
    monkeypatch.setitem(os.environ, "NCCL_ALGO", "Ring")
    applied = recipe.apply(system=make_cpu_system())
    assert [f.id for f in applied.fixes] == ["nccl.env"]


def _fake_compare(fake_clock: Any, system: Any, speed: dict[str, float]) -> Any:
    # A tiny matrix product and attention call, so each fix is seen to reach the step (its
    # proof of effect); the fake clock says how long the step "took".
    x = torch.ones(1, 1, 4, 4)

    def step() -> float:
        torch.nn.functional.scaled_dot_product_attention(x, x, x) @ x
        factor = speed["bf16"] if torch.is_autocast_enabled("cpu") else 1.0
        if not torch.backends.cuda.flash_sdp_enabled():
            factor *= speed["math"]
        fake_clock.advance(0.01 * factor)
        return 1.0

    return compare(
        Workload.from_step(step, name="fake"),
        ["precision.bf16", "attention.backend=math"],
        combine=True,
        system=system,
        clock=fake_clock,
        progress=False,
        measure_memory=False,
        steps_per_sample=1,
    )


def test_comparison_recipe_keeps_faster_fixes_with_evidence(
    fake_clock: Any, bf16_cpu: Any, tmp_path: Any
) -> None:
    c = _fake_compare(fake_clock, bf16_cpu, {"bf16": 0.5, "math": 2.0})  # math backend is slower
    recipe = c.recipe()
    assert [f.id for f in recipe.fixes] == ["precision.bf16"]
    ev = recipe.fixes[0].evidence
    assert ev is not None
    assert ev.verdict == "faster"
    assert ev.speedup == pytest.approx(2.0)
    assert ev.speedup_low is not None
    assert ev.speedup_low <= 2.0 + 1e-9
    assert ev.hardware == c.hardware
    assert "Fake CPU" in ev.hardware
    assert ev.loss_drift == 0.0
    assert ev.workload == "fake"
    assert ev.arm == "precision.bf16"
    assert Recipe.load(recipe.save(tmp_path / "r.yaml")) == recipe


def test_comparison_recipe_prefers_the_best_combination(fake_clock: Any, bf16_cpu: Any) -> None:
    c = _fake_compare(fake_clock, bf16_cpu, {"bf16": 0.5, "math": 0.8})  # both help, together best
    recipe = c.recipe()
    assert [f.id for f in recipe.fixes] == ["precision.bf16", "attention.backend"]
    assert all(
        f.evidence and f.evidence.arm == "precision.bf16+attention.backend=math"
        for f in recipe.fixes
    )
