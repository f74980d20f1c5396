"""Structural fixes defined for findings and recipes, not applied live in this version."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any, Literal

from gpudiag.fixes.spec import FixKind, FixParams, FixSpec, FixTarget, register


class _Planned(FixSpec):
    """A structural fix whose parameters and support checks exist; applying it raises."""

    kind = FixKind.STRUCTURAL
    implemented = False

    def prepare(self, params: Mapping[str, Any], target: FixTarget, stack: ExitStack) -> None:
        raise self.not_implemented(params)


class FsdpParams(FixParams):
    wrap_classes: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    mixed_precision: Literal["bf16", "fp16", "none"] = "none"


@register
class FsdpWrap(_Planned):
    id = "fsdp.wrap"
    summary = (
        "Shard parameters, gradients and optimizer state across ranks with FSDP "
        "(fully_shard per block)."
    )
    Params = FsdpParams

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        try:
            import torch.distributed as dist
        except ImportError:
            return False, "this torch has no torch.distributed"
        if not dist.is_available():
            return False, "this torch was built without distributed support"
        return True, ""
