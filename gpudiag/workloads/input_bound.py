"""An input-pipeline-bound workload: heavy per-sample work in a DataLoader with num_workers=0.

Each sample is "decoded" and augmented on the CPU in the main process (random crop, flip,
repeated blurs, normalisation), so the step waits on the input pipeline while the small model
needs little time: the DataLoader is the bottleneck, as in the num_workers=0 trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpudiag.step import Workload


class AugmentedImages(Dataset[tuple[torch.Tensor, int]]):
    def __init__(
        self,
        length: int = 4096,
        image_size: int = 64,
        crop: int = 48,
        blur_passes: int = 12,
        seed: int = 0,
    ):
        self.length = length
        self.image_size = image_size
        self.crop = crop
        self.blur_passes = blur_passes
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(self.seed * 1_000_003 + index)
        image: np.ndarray[Any, Any] = rng.random((self.image_size, self.image_size, 3))  # "decode"
        top, left = rng.integers(0, self.image_size - self.crop + 1, size=2)
        image = image[top : top + self.crop, left : left + self.crop]
        if rng.random() < 0.5:
            image = image[:, ::-1]
        for _ in range(self.blur_passes):  # a box blur, one pass at a time
            image = (
                image
                + np.roll(image, 1, 0)
                + np.roll(image, -1, 0)
                + np.roll(image, 1, 1)
                + np.roll(image, -1, 1)
            ) / 5
        image = (image - image.mean(axis=(0, 1))) / (image.std(axis=(0, 1)) + 1e-6)
        image = image.astype(np.float32, copy=False)
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), int(index % 10)


def build(
    *,
    batch_size: int = 32,
    num_workers: int = 0,
    blur_passes: int = 12,
    crop: int = 48,
    lr: float = 0.01,
    device: str = "cpu",
    seed: int = 0,
) -> Workload:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).to(device)
    loader = DataLoader(
        AugmentedImages(crop=crop, blur_passes=blur_passes, seed=seed),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
    )

    def loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    return Workload(
        model,
        loss=loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr),
        batch_size=batch_size,
        dataloader=loader,
        name="input_bound",
    )
