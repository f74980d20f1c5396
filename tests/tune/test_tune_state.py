"""gd.tune leaves the user's model, optimizer, RNG and switches as they were: after a normal
search, an exception in a trial, and Ctrl-C in a trial (the trial tests' standard)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch

from gpudiag.errors import FixError
from gpudiag.fixes import Fix
from gpudiag.step import Workload
from gpudiag.tune import tune
from tests.experiment.test_trial_isolation import ENV_KEY, _assert_same, _fingerprint, _trained
from tests.tune.tune_world import ACTIVE, RAISE, world


@pytest.fixture
def user_state() -> Any:
    with world():
        yield _trained()


def _careless_step(model: Any, opt: Any, clock: Any) -> Workload:
    """The user's own step on their model and optimizer, which also changes what a careless
    step changes (switches, seeds, the environment); it raises what RAISE says while that
    fix is entered."""

    def step() -> float:
        for fix_id, exc in RAISE.items():
            if fix_id in ACTIVE:
                raise exc
        loss = model(torch.randint(0, 16, (6,))).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.backends.cudnn.benchmark = True
        torch.set_num_threads(1)
        torch.manual_seed(123)
        random.random()
        np.random.rand()
        os.environ[ENV_KEY] = "changed"
        factor = 0.5 if "test.halve" in ACTIVE else 1.0
        clock.advance(0.01 * factor)
        return float(loss.detach())

    workload = Workload.from_step(step, model=model, optimizer=opt, name="user")
    workload.protected = (model, opt)
    return workload


def _tune(model: Any, opt: Any, clock: Any, system: Any, fixes: list[str]) -> Any:
    return tune(
        _careless_step(model, opt, clock), fixes=fixes, system=system, clock=clock,
        progress=False, diagnosis=False, measure_memory=False, steps_per_sample=1,
        time_budget_s=30,
    )  # fmt: skip


def _rng_states() -> tuple[Any, ...]:
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


def _assert_rng(before: tuple[Any, ...]) -> None:
    after = _rng_states()
    assert torch.equal(after[0], before[0])
    assert after[1] == before[1]
    assert np.array_equal(after[2], before[2])


def test_a_whole_search_restores_everything(
    user_state: Any, fake_clock: Any, bf16_cpu: Any
) -> None:
    model, opt = user_state
    before, rng = _fingerprint(model, opt), _rng_states()
    result = _tune(model, opt, fake_clock, bf16_cpu, ["test.halve", "test.trim"])
    assert result.best.label == "test.halve"
    _assert_same(before, model, opt)
    _assert_rng(rng)
    assert ENV_KEY not in os.environ


def test_an_exception_in_a_trial_restores_everything(
    user_state: Any, fake_clock: Any, bf16_cpu: Any
) -> None:
    model, opt = user_state
    RAISE["test.boom"] = RuntimeError("boom inside the arm")
    before, rng = _fingerprint(model, opt), _rng_states()
    result = _tune(model, opt, fake_clock, bf16_cpu, ["test.boom", "test.halve"])
    assert "boom inside the arm" in next(a for a in result.history if a.label == "test.boom").reason
    _assert_same(before, model, opt)
    _assert_rng(rng)


def test_ctrl_c_in_a_trial_restores_everything_and_propagates(
    user_state: Any, fake_clock: Any, bf16_cpu: Any
) -> None:
    model, opt = user_state
    RAISE["test.boom"] = KeyboardInterrupt()
    before, rng = _fingerprint(model, opt), _rng_states()
    with pytest.raises(KeyboardInterrupt):
        _tune(model, opt, fake_clock, bf16_cpu, ["test.halve", "test.boom"])
    _assert_same(before, model, opt)
    _assert_rng(rng)
    assert ENV_KEY not in os.environ
    with pytest.raises(FixError, match=r"unknown fix id 'control\.none'"):
        Fix("control.none")  # the search's A/A control is unregistered on the way out
