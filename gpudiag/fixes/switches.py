"""cudnn.benchmark: let cuDNN time its convolution algorithms and keep the fastest per shape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpudiag.fixes.spec import FixKind, FixSpec, Step, register

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport


@contextmanager
def cudnn_benchmark_enabled() -> Iterator[None]:
    import torch

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@register
class CudnnBenchmark(FixSpec):
    id = "cudnn.benchmark"
    kind = FixKind.AMBIENT
    summary = (
        "Set torch.backends.cudnn.benchmark = True: cuDNN tries its convolution algorithms "
        "once per "
        "input shape and keeps the fastest (helps fixed-shape CNNs; re-tunes when shapes change)."
    )
    order = 30

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "cuDNN runs only on NVIDIA GPUs: on the CPU the switch changes nothing"
        torch_info = getattr(getattr(system, "host", None), "torch", None)
        cudnn = getattr(torch_info, "cudnn_version", None)
        cuda_build = getattr(torch_info, "cuda_build", None)
        if cudnn is not None and not cudnn.ok and cuda_build is not None and cuda_build.ok:
            return False, "this torch build reports no cuDNN"
        return True, ""

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        return cudnn_benchmark_enabled()

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return ["torch.backends.cudnn.benchmark = True"]
