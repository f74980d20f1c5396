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
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import FixParams, FixSpec, Need, Step, register


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
    needs = frozenset({Need.OWN_STEP})
    trial_only = True
    summary = "Change the micro-batch size, with gradient accumulation to keep the global batch."
    Params = BatchSizeParams
    main_param = "micro_batch"

    def describe(self, params: Mapping[str, Any]) -> str:
        parts = [f"{k}={v}" for k, v in params.items() if v is not None]
        return f"{self.summary} ({', '.join(parts)})" if parts else self.summary

    def missing(self, params: Mapping[str, Any]) -> str:
        if params.get("micro_batch") or params.get("global_batch"):
            return ""
        if int(params.get("accumulation") or 1) > 1:
            return ""
        return (
            "batch.size needs a size: give batch.size=N (samples per forward and backward), "
            "or batch.size:global_batch=N,micro_batch=M (M samples at a time, N per optimizer "
            "step); without one it would measure a copy of the baseline"
        )

    def memory_args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        micro = params.get("micro_batch")
        return {"batch_size": int(micro)} if micro else {}

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Samples per optimizer step as asked: the micro-batches the arm's step really ran."""
        step, ran = arm.step, arm.step.last_run
        micro, accumulation = step.micro_batch, step.accumulation
        if ran is None or micro is None:
            return unverified(self.id, "the arm's step did not record its micro-batches")
        asked = f"asked {micro} x {accumulation}"
        if micro == step.batch_size and accumulation == 1:
            return not_applied(
                self.id,
                f"{micro} x 1 samples per optimizer step is the baseline's own batch: "
                "nothing changes",
                manual="give a different size (batch.size=N)",
            )
        sizes = [s for s in ran.micro_batches if s is not None]
        # A DataLoader's last batch of an epoch may be smaller than the others.
        fits = sizes == [micro] * accumulation or (
            step.dataloader is not None
            and len(sizes) == accumulation
            and all(s <= micro for s in sizes)
        )
        if len(ran.micro_batches) != accumulation or not fits:
            return not_applied(self.id, f"the arm ran {ran}, not what was asked ({asked})")
        base = baseline.step.last_run if baseline is not None else None
        return applied(
            self.id, f"{ran} ({asked}; baseline: {base if base is not None else 'not observed'})"
        )

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
