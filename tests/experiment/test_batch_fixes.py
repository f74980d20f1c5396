"""batch.size and dataloader.tuning in trials, batch splitting, and the batch-scaling probe."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gpudiag.errors import UnsupportedFixError
from gpudiag.experiment.batch_scaling import BatchScaling, batch_scaling, can_scale
from gpudiag.experiment.compare import compare
from gpudiag.experiment.workload import Workload, split_batch
from gpudiag.fixes import Fix, apply_fixes
from gpudiag.fixes.dataloader import rebuild_loader
from tests.experiment.test_compare_fake_clock import run

FIXED_S, PER_SAMPLE_S = 0.008, 0.0005


def clocked_workload(clock: Any, batch_size: int = 4) -> Workload:
    """A linear model whose loss "takes" FIXED_S + PER_SAMPLE_S per sample on the fake clock."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)

    def loss(m: Any, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        clock.advance(FIXED_S + PER_SAMPLE_S * len(b[0]))
        return F.cross_entropy(m(b[0]), b[1])

    return Workload(
        model,
        batch=batch,
        loss=loss,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        batch_size=batch_size,
        name="clocked",
    )


def fixed_rounds(workload: Workload, fixes: list[Any], system: Any) -> Any:
    """A short fixed-protocol comparison (2 rounds) for checks that are not about speed."""
    return compare(
        workload, fixes, system=system, progress=False, max_rounds=2, min_rounds=2, adaptive=False
    )


def test_split_batch_cuts_nested_batches_along_dim_0() -> None:
    Pair = namedtuple("Pair", "x y")
    batch = {"a": torch.arange(8).reshape(4, 2), "p": Pair(torch.arange(4), torch.ones(4)), "n": 3}
    parts = split_batch(batch, 2)
    assert parts is not None
    assert len(parts) == 2
    assert parts[1]["a"].tolist() == [[4, 5], [6, 7]]
    assert isinstance(parts[0]["p"], Pair)
    assert parts[0]["p"].x.tolist() == [0, 1]
    assert parts[0]["n"] == 3
    assert split_batch(torch.zeros(6, 2), 4) is None  # 6 is not divisible by 4
    assert split_batch((torch.zeros(4), torch.zeros(5)), 2) is None  # no common leading size
    assert split_batch(torch.tensor(1.0), 2) is None  # a scalar has no batch dimension


def test_bigger_micro_batch_is_compared_in_samples_per_second(
    fake_clock: Any, bf16_cpu: Any
) -> None:
    c = run(fake_clock, bf16_cpu, clocked_workload(fake_clock), ["batch.size:micro_batch=16"])
    arm = c.arm("batch.size=16")
    base_s, big_s = FIXED_S + 4 * PER_SAMPLE_S, FIXED_S + 16 * PER_SAMPLE_S
    assert arm.step_time.median_s == pytest.approx(big_s)  # raw step time, not rescaled
    assert (c.baseline.samples_per_step, arm.samples_per_step) == (4, 16)
    assert c.speedup().value == pytest.approx(4 * base_s / big_s)  # samples/s ratio
    assert arm.samples_per_s == pytest.approx(16 / big_s)
    assert arm.drift.status == "not measured"
    assert "not comparable" in arm.drift.note
    assert any("retune the learning rate" in n for n in arm.notes)


def test_accumulation_that_keeps_the_batch_splits_it_and_keeps_the_loss(bf16_cpu: Any) -> None:
    from gpudiag.workloads import mlp

    wl = mlp.build(batch_size=8, in_features=8, hidden=16)
    c = fixed_rounds(wl, ["batch.size:micro_batch=2,accumulation=4"], bf16_cpu)
    arm = c.arm()
    assert arm.samples_per_step == c.baseline.samples_per_step == 8
    # Four micro-batches of 2 are the same 8 samples: the loss matches to rounding.
    assert arm.drift.status == "ok", arm.drift
    assert arm.drift.loss_rel is not None
    assert arm.drift.loss_rel < 1e-5


def test_batch_size_needs_gpudiags_own_step() -> None:
    applied = apply_fixes(
        [Fix("batch.size", micro_batch=4)], nn.Linear(2, 2), skip_unsupported=True
    )
    assert [f.id for f, _why in applied.skipped] == ["batch.size"]
    assert "accumulation" in applied.skipped[0][1]  # says how to do it in a script
    with pytest.raises(UnsupportedFixError, match="trials only"):
        apply_fixes([Fix("batch.size", micro_batch=4)], nn.Linear(2, 2), check=False)


def _loader_workload(loader: DataLoader[Any]) -> Workload:
    torch.manual_seed(0)
    return Workload(
        nn.Linear(4, 2),
        dataloader=loader,
        loss=lambda m, b: F.mse_loss(m(b[0]), b[1]),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        name="loader",
    )


def test_rebuild_loader_keeps_dataset_sampler_and_collate() -> None:
    data = TensorDataset(torch.randn(12, 4), torch.randn(12, 2))

    def collate(rows: list[Any]) -> Any:
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate, drop_last=True)
    new = rebuild_loader(loader, num_workers=1, persistent_workers=True, prefetch_factor=2)
    assert (new.dataset, new.sampler, new.collate_fn) == (data, loader.sampler, collate)
    assert (new.batch_size, new.drop_last, new.num_workers) == (4, True, 1)
    assert new.persistent_workers
    assert loader.num_workers == 0
    smaller = rebuild_loader(loader, batch_size=2)
    assert smaller.batch_size == 2
    assert smaller.prefetch_factor is None

    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Any:
            return iter([(torch.zeros(4), torch.zeros(2))] * 6)

    streamed = rebuild_loader(DataLoader(Stream(), batch_size=3), batch_size=2)
    assert [len(b[0]) for b in streamed] == [2, 2, 2]


@pytest.mark.slow
def test_dataloader_tuning_runs_workers_on_a_copy_of_the_loader(bf16_cpu: Any) -> None:
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    loader = DataLoader(data, batch_size=8)
    c = fixed_rounds(_loader_workload(loader), ["dataloader.tuning:num_workers=1"], bf16_cpu)
    arm = c.arm()
    assert arm.error is None
    assert arm.drift.status == "ok"  # same batches, same order
    assert any("pin_memory left off" in n for n in arm.notes)  # no CUDA device here
    assert loader.num_workers == 0  # the user's loader is untouched


def test_dataloader_tuning_is_skipped_without_a_dataloader(fake_clock: Any, bf16_cpu: Any) -> None:
    c = run(fake_clock, bf16_cpu, clocked_workload(fake_clock), ["dataloader.tuning"])
    assert dict(c.skipped)["dataloader.tuning"].startswith(
        "dataloader.tuning needs a torch DataLoader"
    )


def test_batch_scaling_solves_the_fixed_and_per_sample_costs(fake_clock: Any) -> None:
    wl = clocked_workload(fake_clock, batch_size=4)
    s = batch_scaling(wl, factor=4, rounds=3, steps=2, clock=fake_clock)
    assert (s.batch_size, s.larger_batch_size) == (4, 16)
    assert s.step_s == pytest.approx(FIXED_S + 4 * PER_SAMPLE_S)
    assert s.larger_step_s == pytest.approx(FIXED_S + 16 * PER_SAMPLE_S)
    assert s.fixed_share == pytest.approx(FIXED_S / (FIXED_S + 4 * PER_SAMPLE_S))
    assert s.fixed_share_low == pytest.approx(s.fixed_share)
    assert s.throughput_gain == pytest.approx(4 * s.step_s / s.larger_step_s)
    assert s.to_dict()["rounds"]
    assert len(s.rounds) == 3


def test_batch_scaling_leaves_the_users_model_alone(fake_clock: Any) -> None:
    wl = clocked_workload(fake_clock)
    before = {k: v.clone() for k, v in wl.model.state_dict().items()}
    batch_scaling(wl, rounds=1, steps=1, clock=fake_clock)
    assert all(torch.equal(before[k], v) for k, v in wl.model.state_dict().items())


def test_batch_scaling_says_when_it_cannot_run() -> None:
    step_wl = Workload.from_step(lambda: None)
    assert "own step function" in (can_scale(step_wl) or "")
    loader_wl = _loader_workload(DataLoader(TensorDataset(torch.zeros(4, 4), torch.zeros(4, 2))))
    assert "dataloader" in (can_scale(loader_wl) or "")


def test_noisy_rounds_lower_the_conservative_share() -> None:
    s = BatchScaling(8, 32, 0.010, 0.012, ((0.010, 0.012), (0.010, 0.031), (0.010, 0.012)))
    assert s.fixed_share == pytest.approx((4 * 0.010 - 0.012) / (3 * 0.010))
    assert s.fixed_share_low == pytest.approx(0.3)  # the round where the big batch took 3.1x
    busy = BatchScaling(8, 32, 0.01, 0.012, ((0.01, 0.012),), load_average=5.0, cpus=2)
    assert busy.host_busy
    assert not s.host_busy


def test_a_round_below_the_callers_threshold_ends_the_measurement(fake_clock: Any) -> None:
    wl = clocked_workload(fake_clock, batch_size=64)  # the per-sample cost dominates
    s = batch_scaling(wl, rounds=3, stop_below=0.5, clock=fake_clock)
    assert len(s.rounds) == 1
    assert "stopped after round 1" in s.notes[0]
    # Without a threshold every round runs.
    assert len(batch_scaling(wl, rounds=3, clock=fake_clock).rounds) == 3


def test_batch_size_on_a_dataloader_rebuilds_it_at_the_micro_batch(bf16_cpu: Any) -> None:
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    loader = DataLoader(data, batch_size=8)
    c = fixed_rounds(
        _loader_workload(loader), ["batch.size:micro_batch=4,accumulation=2"], bf16_cpu
    )
    arm = c.arm()
    assert arm.error is None
    assert arm.samples_per_step == c.baseline.samples_per_step == 8
    # Two micro-batches of 4 in loader order are the baseline's batch of 8: same loss.
    assert arm.drift.status == "ok"
    assert loader.batch_size == 8  # the user's loader is untouched
