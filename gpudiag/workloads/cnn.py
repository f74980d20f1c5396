"""A small fp32 CNN with BatchNorm on 32x32 images, trained with SGD and momentum."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpudiag.step import Workload


def conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(3, width, 1), conv_bn(width, 2 * width, 2), conv_bn(2 * width, 4 * width, 2)
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def build(
    *,
    batch_size: int = 32,
    image_size: int = 32,
    width: int = 32,
    classes: int = 10,
    lr: float = 0.05,
    device: str = "cpu",
    seed: int = 0,
) -> Workload:
    torch.manual_seed(seed)
    model = SmallCNN(classes, width).to(device)

    def batch(bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        images = torch.randn(bs, 3, image_size, image_size, generator=g)
        return images, torch.randint(0, classes, (bs,), generator=g)

    def loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    return Workload(
        model,
        batch=batch,
        loss=loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        batch_size=batch_size,
        name="cnn",
    )
