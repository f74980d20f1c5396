"""cudnn.benchmark: let cuDNN time its convolution algorithms and keep the fastest per shape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import FixSpec, Step, register

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

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """The switch read back inside the arm, and convolutions that it governs."""
        switch = arm.switches.get("cudnn.benchmark")
        if switch is not True:
            return not_applied(
                self.id, f"torch.backends.cudnn.benchmark read back {switch!r} in the arm"
            )
        if arm.ops is None:
            return unverified(
                self.id,
                f"the switch is on, but the arm's operators were not counted ({arm.ops_missing})",
            )
        if not arm.ops.convolutions:
            return not_applied(
                self.id, "the step ran no convolution: cudnn.benchmark governs nothing here"
            )
        return applied(
            self.id,
            f"cudnn.benchmark read back True inside the arm; {arm.ops.convolutions} "
            "convolution call(s) ran under it",
        )
