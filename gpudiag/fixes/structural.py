"""Structural fixes defined for findings and recipes, not applied live in this version."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any, Literal

from pydantic import Field, model_validator

from gpudiag.fixes import _system
from gpudiag.fixes.base import FixKind, FixParams, FixSpec, FixTarget, register


class _Planned(FixSpec):
    """A structural fix whose parameters and support checks exist; applying it raises."""

    kind = FixKind.STRUCTURAL
    implemented = False

    def prepare(self, params: Mapping[str, Any], target: FixTarget, stack: ExitStack) -> None:
        raise self.not_implemented(params)


class BatchSizeParams(FixParams):
    micro_batch: int | None = Field(None, ge=1)
    accumulation: int = Field(1, ge=1)
    global_batch: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> BatchSizeParams:
        if self.micro_batch and self.global_batch and self.global_batch % self.micro_batch:
            raise ValueError("global_batch must be a multiple of micro_batch")
        return self


@register
class BatchSize(_Planned):
    id = "batch.size"
    summary = "Change the micro-batch size, with gradient accumulation to keep the global batch."
    Params = BatchSizeParams
    main_param = "micro_batch"

    def describe(self, params: Mapping[str, Any]) -> str:
        parts = [f"{k}={v}" for k, v in params.items() if v is not None]
        return f"{self.summary} ({', '.join(parts)})" if parts else self.summary


class CheckpointingParams(FixParams):
    every_n_layers: int = Field(1, ge=1)
    classes: tuple[str, ...] = ()


@register
class ActivationCheckpointing(_Planned):
    id = "activation.checkpointing"
    summary = (
        "Recompute activations in the backward pass instead of keeping them "
        "(torch.utils.checkpoint): less memory for a bigger batch, at some extra compute."
    )
    Params = CheckpointingParams
    main_param = "every_n_layers"


class DataLoaderParams(FixParams):
    num_workers: int | None = Field(None, ge=0)
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: int | None = Field(2, ge=1)


@register
class DataLoaderTuning(_Planned):
    id = "dataloader.tuning"
    summary = (
        "Load batches in worker processes (num_workers), into pinned memory, with workers kept "
        "alive between epochs, so the input pipeline overlaps the step."
    )
    Params = DataLoaderParams
    main_param = "num_workers"

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        cores = getattr(
            getattr(_system.host(system), "logical_cores", None), "get", lambda d=None: d
        )(None)
        workers = params.get("num_workers")
        if cores is not None and workers is not None and workers > cores:
            return False, f"{workers} workers on {cores} logical cores would oversubscribe the CPU"
        return True, ""


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


@register
class CudaGraphs(_Planned):
    id = "cuda.graphs"
    summary = "Capture the step in a CUDA graph and replay it: one launch instead of hundreds."

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "CUDA graphs exist only on NVIDIA GPUs"
        return True, ""
