"""A user's own workload factory, importable by name ('tests.distributed.wl_factory:make')."""

from __future__ import annotations

import os
import time

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


def rank1_crashes(width: int = 8, seed: int = 0, device: str = "cpu") -> Workload:
    """Rank 1's own workload fails to build; rank 0's does not (it then waits for rank 1)."""
    if os.environ.get("RANK") == "1":
        raise ValueError("boom from rank 1's own workload")
    return make(width, seed, device)


def rank1_hangs(width: int = 8, seed: int = 0, device: str = "cpu") -> Workload:
    """Rank 1 never finishes building its workload."""
    if os.environ.get("RANK") == "1":
        time.sleep(600)
    return make(width, seed, device)
