"""batch.size: the micro-batch gpudiag's own step feeds, with gradient accumulation.

``micro_batch`` samples go through forward and backward at a time; ``accumulation``
micro-batches (or ``global_batch / micro_batch``) make one optimizer step. When micro-batch x
accumulation equals the workload's batch, the trial splits the workload's own batch, so the
loss and gradients stay the same (up to rounding) and drift is measured as for any fix; a
different global batch changes the optimisation, and the comparison says so. Speedups of a
batch arm are in samples/s. Runs for real on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from pydantic import Field, model_validator

from gpudiag.errors import FixError, UnsupportedFixError
from gpudiag.fixes.spec import FixKind, FixParams, FixSpec, Step, register


class BatchSizeParams(FixParams):
    micro_batch: int | None = Field(None, ge=1)
    accumulation: int = Field(1, ge=1)
    global_batch: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> BatchSizeParams:
        if self.micro_batch and self.global_batch and self.global_batch % self.micro_batch:
            raise ValueError("global_batch must be a multiple of micro_batch")
        return self


def resolve(params: Mapping[str, Any], batch_size: int) -> tuple[int, int]:
    """(micro_batch, accumulation) for a workload whose step takes ``batch_size`` samples."""
    micro = int(params.get("micro_batch") or batch_size)
    global_batch = params.get("global_batch")
    if global_batch:
        if int(global_batch) % micro:
            raise FixError(
                f"batch.size: global_batch {global_batch} is not a multiple of the micro-batch "
                f"{micro}"
            )
        return micro, int(global_batch) // micro
    return micro, int(params.get("accumulation") or 1)


@register
class BatchSize(FixSpec):
    id = "batch.size"
    kind = FixKind.STRUCTURAL
    trial_only = True
    summary = "Change the micro-batch size, with gradient accumulation to keep the global batch."
    Params = BatchSizeParams
    main_param = "micro_batch"

    def describe(self, params: Mapping[str, Any]) -> str:
        parts = [f"{k}={v}" for k, v in params.items() if v is not None]
        return f"{self.summary} ({', '.join(parts)})" if parts else self.summary

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        if not target.owns_step or not target.batch_size:
            raise UnsupportedFixError(
                "batch.size changes the batch gpudiag's own step builds (a gd.Workload with "
                "batch= or dataloader=); in a training script change the DataLoader's "
                "batch_size and accumulate gradients (see the recipe's to_python())"
            )
        micro, accumulation = resolve(params, target.batch_size)
        before = (target.micro_batch, target.accumulation)
        target.micro_batch, target.accumulation = micro, accumulation
        stack.callback(_restore, target, before)
        if micro * accumulation != target.batch_size:
            target.notes.append(
                f"batch.size: {micro} x {accumulation} = {micro * accumulation} samples per "
                f"optimizer step instead of {target.batch_size}: the optimisation changes "
                "(retune the learning rate); the speedup is in samples/s"
            )

    def code(self, params: Mapping[str, Any]) -> list[str]:
        micro = params.get("micro_batch") or "batch_size"
        global_batch = params.get("global_batch")
        accumulation = (
            f"{global_batch} // {micro}" if global_batch else str(params.get("accumulation", 1))
        )
        return [
            f"accumulation = {accumulation}",
            f"loader = torch.utils.data.DataLoader(dataset, batch_size={micro})",
            "for i, batch in enumerate(loader):",
            "    loss = loss_fn(model, batch) / accumulation",
            "    loss.backward()",
            "    if (i + 1) % accumulation == 0:",
            "        optimizer.step()",
            "        optimizer.zero_grad(set_to_none=True)",
        ]


def _restore(target: Step, before: tuple[int | None, int]) -> None:
    target.micro_batch, target.accumulation = before
