"""dataloader.tuning: load batches in worker processes, pinned, with workers kept alive.

A trial rebuilds the workload's ``torch.utils.data.DataLoader`` over the same dataset, sampler
and collate function with the new settings (``rebuild_loader``); the user's loader is never
touched. Runs for real on the CPU; ``pin_memory`` only matters with a CUDA device and is left
off without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from pydantic import Field

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import FixParams, FixSpec, Need, Step, register
from gpudiag.probe.host import usable_cpus
from gpudiag.step import rebuild_loader

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# Workers chosen when none are given: one per spare CPU (the training process keeps one),
# at most this many (more rarely helps a single GPU's input pipeline and costs memory).
MAX_AUTO_WORKERS = 8

__all__ = ["DataLoaderTuning", "auto_workers", "rebuild_loader"]


class DataLoaderParams(FixParams):
    num_workers: int | None = Field(None, ge=0)
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: int | None = Field(2, ge=1)


def auto_workers() -> int:
    return max(1, min(MAX_AUTO_WORKERS, usable_cpus() - 1))


@register
class DataLoaderTuning(FixSpec):
    id = "dataloader.tuning"
    needs = frozenset({Need.OWN_STEP, Need.DATALOADER})
    trial_only = True
    summary = (
        "Load batches in worker processes (num_workers), into pinned memory, with workers kept "
        "alive between epochs, so the input pipeline overlaps the step."
    )
    Params = DataLoaderParams
    main_param = "num_workers"

    def describe(self, params: Mapping[str, Any]) -> str:
        workers = params.get("num_workers")
        return f"{self.summary} (num_workers={'auto' if workers is None else workers})"

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        cores = getattr(
            getattr(_system.host(system), "logical_cores", None), "get", lambda d=None: d
        )(None)
        workers = params.get("num_workers")
        if cores is not None and workers is not None and workers > cores:
            return False, f"{workers} workers on {cores} logical cores would oversubscribe the CPU"
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        if target.dataloader is None:
            raise UnsupportedFixError(
                "dataloader.tuning changes a torch DataLoader: give the workload dataloader= "
                "(in a training script, set these DataLoader arguments yourself: see the "
                "recipe's to_python())"
            )
        workers = params.get("num_workers")
        workers = auto_workers() if workers is None else int(workers)
        pin = bool(params.get("pin_memory", True)) and target.device_type == "cuda"
        if params.get("pin_memory", True) and not pin:
            target.notes.append("dataloader.tuning: pin_memory left off (no CUDA device)")
        original = target.dataloader
        target.state[self.id] = workers
        target.dataloader = rebuild_loader(
            original,
            num_workers=workers,
            pin_memory=pin,
            persistent_workers=bool(params.get("persistent_workers", True)) and workers > 0,
            prefetch_factor=params.get("prefetch_factor") if workers > 0 else None,
        )
        stack.callback(setattr, target, "dataloader", original)

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """The arm's DataLoader has the workers asked for, and they are alive (read from the
        loader the step iterates: with a batch fix, the one rebuilt at its batch size)."""
        loader = arm.step.loader_in_use
        asked = arm.step.state.get(self.id)
        if loader is None or asked is None:
            return not_applied(self.id, "the arm's step has no rebuilt DataLoader")
        settings = (
            f"num_workers={loader.num_workers}, pin_memory={loader.pin_memory}, "
            f"persistent_workers={loader.persistent_workers}"
        )
        if loader.num_workers != asked:
            return not_applied(self.id, f"the arm's DataLoader has {settings}, not {asked} workers")
        if not asked:
            return applied(self.id, f"{settings} read back from the arm's DataLoader")
        workers = getattr(getattr(loader, "_iterator", None), "_workers", None)
        if workers is None:
            why = (
                "the step has not iterated it"
                if loader.persistent_workers
                else "its worker processes are not kept between epochs (persistent_workers=False)"
            )
            return unverified(self.id, f"{settings}; {why}, so they could not be counted")
        alive = sum(1 for w in workers if w.is_alive())
        if alive < asked:
            return not_applied(
                self.id, f"{alive} of {asked} DataLoader worker processes alive ({settings})"
            )
        return applied(self.id, f"{alive} DataLoader worker processes alive ({settings})")

    def code(self, params: Mapping[str, Any]) -> list[str]:
        workers = params.get("num_workers")
        return [
            "loader = torch.utils.data.DataLoader(",
            "    dataset,",
            "    batch_size=batch_size,",
            f"    num_workers={'os.cpu_count() - 1' if workers is None else workers},",
            f"    pin_memory={bool(params.get('pin_memory', True))},  # with a CUDA device",
            f"    persistent_workers={bool(params.get('persistent_workers', True))},",
            f"    prefetch_factor={params.get('prefetch_factor', 2)},",
            ")",
        ]
