"""How a workload's step time grows with its batch: is the step paying a fixed per-step cost?

A step at batch ``B`` costs roughly ``fixed + per_sample * B``: the fixed part is Python,
kernel launches, the optimizer over every parameter, and small kernels that do not fill the
device. ``batch_scaling`` times the step at ``B`` and at ``factor * B`` (interleaved, on a
copy of the model, inside an isolated trial) and solves for that split. When most of the step
is the fixed part, a bigger micro-batch is nearly free per step: samples/s rise with it.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag._progress import ProgressFn, finish, report
from gpudiag._report import jsonable
from gpudiag.experiment.runner import Arm
from gpudiag.experiment.trial import isolated
from gpudiag.probe import cuda
from gpudiag.probe.host import load_average, usable_cpus
from gpudiag.step import Workload

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# A round times the small batch for at least this long (capped at MAX_STEPS steps).
MIN_ROUND_S = 0.05
MAX_STEPS = 100


@dataclass(frozen=True)
class BatchScaling:
    """Median step time at two batch sizes, and the fixed share of a step at the smaller."""

    batch_size: int
    larger_batch_size: int
    step_s: float
    larger_step_s: float
    rounds: tuple[tuple[float, float], ...]  # (step_s, larger_step_s) of each round
    notes: tuple[str, ...] = ()
    # Host load while measuring (1-minute load average, highest of before/after) and the CPUs
    # this process may use: CPU timings taken on a busy machine overstate per-step costs.
    load_average: float | None = None
    cpus: int | None = None

    @property
    def host_busy(self) -> bool:
        """Other processes competed for the CPUs while measuring (load > CPUs + 1)."""
        return (
            self.load_average is not None
            and self.cpus is not None
            and (self.load_average > self.cpus + 1)
        )

    @property
    def factor(self) -> float:
        return self.larger_batch_size / self.batch_size

    def _share(self, t1: float, t2: float) -> float:
        return _share(self.factor, t1, t2)

    @property
    def fixed_share(self) -> float:
        """Share of a step at ``batch_size`` that does not grow with the batch (0..1), from the
        line through the two measured points (medians)."""
        return self._share(self.step_s, self.larger_step_s)

    @property
    def fixed_share_low(self) -> float:
        """The lowest per-round fixed share: a claim every round supports, not one noisy round."""
        return min(self._share(t1, t2) for t1, t2 in self.rounds)

    @property
    def throughput_gain(self) -> float:
        """Samples/s at the larger batch over samples/s at ``batch_size``."""
        return self.factor * self.step_s / self.larger_step_s

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "batch_size": self.batch_size,
                "larger_batch_size": self.larger_batch_size,
                "step_s": self.step_s,
                "larger_step_s": self.larger_step_s,
                "rounds": [list(r) for r in self.rounds],
                "fixed_share": self.fixed_share,
                "fixed_share_low": self.fixed_share_low,
                "load_average": self.load_average,
                "cpus": self.cpus,
                "throughput_gain": self.throughput_gain,
                "notes": list(self.notes),
            }
        )

    def __repr__(self) -> str:
        return (
            f"BatchScaling(batch {self.batch_size}: {self.step_s * 1e3:.2f} ms/step, batch "
            f"{self.larger_batch_size}: {self.larger_step_s * 1e3:.2f} ms/step; fixed share "
            f"{self.fixed_share:.0%}, samples/s x{self.throughput_gain:.2f})"
        )


def _share(k: float, t1: float, t2: float) -> float:
    """Fixed share of a step of ``t1`` seconds when ``k`` times the batch takes ``t2``."""
    return min(1.0, max(0.0, (k * t1 - t2) / ((k - 1) * t1)))


def can_scale(workload: Any) -> str | None:
    """None when ``batch_scaling`` can run on the workload, else why not."""
    if not isinstance(workload, Workload) or not workload.owns_step:
        return "the workload runs its own step function (gpudiag cannot change its batch)"
    if workload.dataloader is not None or not callable(workload.batch):
        return "the batch comes from a dataloader or a fixed batch, not batch=(batch_size -> batch)"
    return None


def batch_scaling(
    workload: Workload,
    *,
    factor: int = 4,
    rounds: int = 3,
    steps: int | None = None,
    stop_below: float | None = None,
    system: SystemReport | None = None,
    clock: Callable[[], float] | None = None,
    on_progress: ProgressFn | None = None,
) -> BatchScaling:
    """Time the step at the workload's batch and at ``factor`` times it, alternating for
    ``rounds`` rounds after one warm-up step each; medians per step. Runs on a deep copy of the
    model inside ``isolated()``. When the larger batch runs out of memory, factor 2 is tried.

    ``steps`` per round and batch size: by default as many as make a round of the small batch
    last ``MIN_ROUND_S`` (from its warm-up step; at least 1), so a 1 ms step is timed over many
    steps and a 1 s step once. ``stop_below``: stop after a round whose fixed share is below it
    (a caller that only asks "is the fixed share at least X in every round?" has its answer).
    ``clock``: seconds (default: CUDA events on a GPU, ``time.perf_counter`` on the CPU).
    ``on_progress``: a ``Progress("batch scaling", round, rounds)`` after each round, and
    ``finished`` at the end, also when ``stop_below`` ends it early."""
    why = can_scale(workload)
    if why is not None:
        from gpudiag.step import WorkloadError

        raise WorkloadError(f"cannot scale the batch: {why}")
    notes: list[str] = []
    for k in (factor, 2) if factor > 2 else (factor,):
        try:
            result = _measure(
                workload, k, rounds, steps, stop_below, system, clock, notes, on_progress
            )
            finish(on_progress, "batch scaling")
            return result
        except Exception as exc:
            if not cuda.is_oom_error(exc) or k == 2:
                raise
            notes.append(f"batch {k * workload.batch_size} ran out of memory")
            cuda.empty_cache()
    raise AssertionError("unreachable")


def _measure(
    workload: Workload,
    k: int,
    rounds: int,
    steps: int | None,
    stop_below: float | None,
    system: SystemReport | None,
    clock: Callable[[], float] | None,
    notes: list[str],
    on_progress: ProgressFn | None = None,
) -> BatchScaling:
    model = copy.deepcopy(workload.model)
    device_type = workload.device_type
    arms = []
    for size in (workload.batch_size, k * workload.batch_size):
        sized = copy.copy(workload)
        sized.batch_size = size
        arms.append(Arm(f"batch {size}", (), sized, model, True, device_type, system))
    times: list[list[float]] = [[], []]
    load_before = load_average()
    if clock is None and device_type != "cuda":
        clock = time.perf_counter
    with isolated(verify=False):
        for arm in arms:
            arm.open()
            arm.new_optimizer()
        arms[1].target.optimizer = arms[0].target.optimizer  # one state for one model
        try:
            # Warm-up: allocator, autotuning, lazy init; the small batch's step sizes a round.
            report(on_progress, "batch scaling", 0, rounds)
            warm = [arm.timed(1, clock) for arm in arms]
            n = steps or max(1, min(MAX_STEPS, math.ceil(MIN_ROUND_S / max(warm[0], 1e-9))))
            for r in range(rounds):
                for i, arm in enumerate(arms):
                    times[i].append(arm.timed(n, clock))
                report(on_progress, "batch scaling", r + 1, rounds)
                if stop_below is not None and _share(k, times[0][-1], times[1][-1]) < stop_below:
                    if r + 1 < rounds:
                        below = f"its fixed share is below {stop_below:.0%}"
                        notes.append(f"stopped after round {r + 1}: {below}")
                    break
        finally:
            for arm in arms:
                arm.close()
    return BatchScaling(
        workload.batch_size,
        k * workload.batch_size,
        statistics.median(times[0]),
        statistics.median(times[1]),
        tuple(zip(times[0], times[1], strict=True)),
        tuple(notes),
        load_average=max((x for x in (load_before, load_average()) if x is not None), default=None),
        cpus=usable_cpus(),
    )
