"""A user's own workload factory, importable by name ('tests.distributed.wl_factory:make')."""

from __future__ import annotations

import torch
from torch import nn

from gpudiag.experiment.workload import Workload


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def make(width: int = 8, seed: int = 0, device: str = "cpu") -> Workload:
    torch.manual_seed(seed)
    model = nn.Sequential(*(Layer(width) for _ in range(3))).to(device)
    return Workload(
        model,
        batch=lambda bs: torch.randn(bs, width, generator=torch.Generator().manual_seed(1)),
        loss=lambda m, x: m(x).pow(2).mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        batch_size=4,
        name="wl_factory",
    )


def not_a_workload() -> int:
    return 3
