"""A plain fp32 MLP classifier on random features: no attention, few large matmuls."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpudiag.step import Workload


def build(
    *,
    batch_size: int = 256,
    in_features: int = 256,
    hidden: int = 1024,
    depth: int = 2,
    classes: int = 10,
    lr: float = 1e-3,
    device: str = "cpu",
    seed: int = 0,
) -> Workload:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(in_features, hidden), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    layers.append(nn.Linear(hidden, classes))
    model = nn.Sequential(*layers).to(device)

    def batch(bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(bs, in_features, generator=g), torch.randint(
            0, classes, (bs,), generator=g
        )

    def loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    return Workload(
        model,
        batch=batch,
        loss=loss,
        optimizer=lambda params: torch.optim.Adam(params, lr=lr),
        batch_size=batch_size,
        name="mlp",
    )
