"""gd.Workload: what it accepts, what it refuses, and how it describes itself."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gpudiag.step import Workload, WorkloadError, default_loss, move_to


def test_refuses_what_it_cannot_run() -> None:
    with pytest.raises(WorkloadError, match="from_step"):
        Workload(lambda x: x)
    with pytest.raises(WorkloadError, match="batch="):
        Workload(nn.Linear(2, 2))
    with pytest.raises(WorkloadError, match="batch_size"):
        Workload(nn.Linear(2, 2), batch=torch.zeros(1, 2), batch_size=0)
    with pytest.raises(WorkloadError, match="optimizer="):
        Workload(nn.Linear(2, 2), batch=torch.zeros(1, 2), optimizer=3)
    with pytest.raises(WorkloadError, match="callable"):
        Workload.from_step(42)  # type: ignore[arg-type]


def test_default_loss_needs_a_scalar_or_dot_loss() -> None:
    with pytest.raises(WorkloadError, match="loss="):
        default_loss(nn.Linear(2, 2), torch.zeros(3, 2))

    class WithLoss(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": (x - y).square().mean()}

    assert default_loss(WithLoss(), {"x": torch.ones(2), "y": torch.zeros(2)}).item() == 1.0
    assert default_loss(WithLoss(), (torch.ones(2), torch.ones(2))).item() == 0.0


def test_an_optimizer_instance_is_rebuilt_with_its_settings() -> None:
    model = nn.Linear(2, 2)
    wl = Workload(
        model,
        batch=torch.zeros(1, 2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
    )
    assert wl.optimizer_factory is not None
    fresh = wl.optimizer_factory(model.parameters())
    assert isinstance(fresh, torch.optim.SGD)
    assert fresh.defaults["lr"] == 0.5
    assert fresh.defaults["momentum"] == 0.9
    assert fresh is not wl.optimizer


def test_fixed_batch_is_built_once_and_reused() -> None:
    calls = []

    def batch(n: int) -> torch.Tensor:
        calls.append(n)
        return torch.randn(n, 2)

    wl = Workload(nn.Linear(2, 2), batch=batch, batch_size=3)
    it = wl.batches()
    a, b = next(it), next(it)
    assert calls == [3]
    assert a is b


def test_move_to_keeps_structure() -> None:
    batch = {"x": torch.zeros(1), "meta": "keep", "pair": (torch.ones(1), 3)}
    moved = move_to(batch, torch.device("cpu"))
    assert moved["meta"] == "keep"
    assert moved["pair"][1] == 3
    assert moved["x"] is batch["x"]


def test_describe_and_json() -> None:
    wl = Workload(
        nn.Linear(4, 2),
        batch=torch.zeros(1, 4),
        optimizer=torch.optim.Adam,
        tokens_per_sample=7,
        name="<w>",
    )
    assert "Linear" in repr(wl)
    assert "Adam" in repr(wl)
    data = json.loads(json.dumps(wl.to_dict()))
    assert data["tokens_per_sample"] == 7
    assert data["kind"] == "model"
    assert "&lt;w&gt;" in wl._repr_html_()
    step = Workload.from_step(lambda: None, name="s")
    assert step.to_dict()["kind"] == "step function"
    assert not step.owns_step
