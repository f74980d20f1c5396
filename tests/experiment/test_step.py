"""gpudiag.step.Step: the one training step that trials, diagnose, the demo and fixes share."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import torch
from torch import nn

import gpudiag as gd
from gpudiag.experiment import workload as experiment_workload
from gpudiag.fixes import Fix, apply_fixes
from gpudiag.fixes.base import ambient, transform
from gpudiag.step import Step, Workload, WorkloadError


class Recorder(nn.Linear):
    """A linear layer that remembers the batch size and autocast state of each forward."""

    def __init__(self) -> None:
        super().__init__(4, 1)
        self.seen: list[tuple[int, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((int(x.shape[0]), torch.is_autocast_enabled("cpu")))
        return super().forward(x)


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return (model(x) - y).square().mean()


def regression(model: nn.Module, batch_size: int = 8) -> Workload:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch_size, 4, generator=g), torch.randn(batch_size, 1, generator=g)
    return Workload(
        model,
        batch=(x, y),
        loss=mse,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        batch_size=batch_size,
    )


def test_workload_is_one_class_wherever_it_is_imported() -> None:
    assert gd.Workload is Workload is experiment_workload.Workload


def test_a_step_runs_forward_backward_and_the_optimizer() -> None:
    torch.manual_seed(0)
    model = Recorder()
    before = model.weight.detach().clone()
    step = Step.of(regression(model))
    step.new_optimizer()
    loss, norm = step.run(record=True)
    assert loss is not None
    assert loss > 0
    assert norm is not None
    assert norm > 0
    assert not torch.equal(model.weight, before)  # the optimizer stepped
    assert all(p.grad is None for p in model.parameters())  # and zeroed the gradients
    assert model.seen == [(8, False)]


def test_accumulation_over_split_micro_batches_matches_one_full_step() -> None:
    torch.manual_seed(0)
    whole, split = Recorder(), Recorder()
    split.load_state_dict(whole.state_dict())
    one = Step.of(regression(whole))
    one.new_optimizer()
    two = Step.of(regression(split))
    with ExitStack() as stack:
        transform(two, [Fix("batch.size", micro_batch=4, accumulation=2)], stack)
        assert two.samples_per_step() == 8
        two.new_optimizer()
        loss_one, _ = one.run(record=True)
        loss_two, _ = two.run(record=True)
    assert split.seen == [(4, False), (4, False)]
    assert loss_two == pytest.approx(loss_one, rel=1e-5)
    torch.testing.assert_close(split.weight, whole.weight)
    assert (two.micro_batch, two.accumulation) == (None, 1)  # the stack undid the transform


def test_grad_sync_is_told_which_micro_batch_is_the_last() -> None:
    calls: list[bool] = []

    @contextmanager
    def sync(last: bool) -> Any:
        calls.append(last)
        yield

    model = Recorder()
    wl = regression(model)
    step = Step.of(wl)
    step.grad_sync = sync
    step.keep_loss = True
    x, y = wl.make_batch()
    step.feed([(x[:4], y[:4]), (x[4:], y[4:])])
    step.run()
    step.run()
    assert calls == [False, True, False, True]
    assert isinstance(step.last_loss, torch.Tensor)
    assert step.last_loss.requires_grad is False


def test_bf16_scope_puts_the_forward_under_autocast(bf16_cpu: Any) -> None:
    # bf16 is ambient: its hook is a scope around the step's calls (transform leaves it).
    model = Recorder()
    step = Step.of(regression(model))
    with ExitStack() as stack:
        transform(step, [Fix("precision.bf16")], stack)
        assert step.autocast_dtype is None
        with ambient(step, [Fix("precision.bf16")]):
            assert step.autocast_dtype == torch.bfloat16
            step.run()
    assert step.autocast_dtype is None
    step.run()
    assert [on for _, on in model.seen] == [True, False]


def test_apply_fixes_on_a_users_model_changes_a_step() -> None:
    model = Recorder()
    with apply_fixes([Fix("precision.bf16")], model, check=False) as applied:
        assert isinstance(applied.target, Step)
        assert applied.target.autocast_dtype == torch.bfloat16
        model(torch.zeros(2, 4))
    assert model.seen == [(2, True)]


def test_a_step_without_a_workload_says_how_to_build_one() -> None:
    with pytest.raises(WorkloadError, match=r"Step\.of"):
        Step(model=nn.Linear(2, 2)).run()


def test_a_step_function_runs_under_the_steps_autocast() -> None:
    seen: list[bool] = []

    def user_step() -> float:
        seen.append(torch.is_autocast_enabled("cpu"))
        return 0.5

    step = Step.of(Workload.from_step(user_step))
    assert step.run(record=True) == (0.5, None)
    step.autocast_dtype = torch.bfloat16
    step.run()
    assert seen == [False, True]


def test_next_micro_batches_are_the_split_of_the_next_step() -> None:
    model = Recorder()
    step = Step.of(regression(model))
    with ExitStack() as stack:
        transform(step, [Fix("batch.size", micro_batch=4, accumulation=2)], stack)
        step.open()
        parts = step.next_micro_batches()
    assert [tuple(x.shape) for x, _ in parts] == [(4, 4), (4, 4)]
    assert model.seen == []  # reading the batches runs nothing
    assert Step.of(Workload.from_step(lambda: 0.5)).next_micro_batches() == []
