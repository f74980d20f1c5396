"""One arm of a comparison: a workload with its fixes applied, run step by step and timed."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag.errors import UnsupportedFixError
from gpudiag.experiment.drift import StepTrace
from gpudiag.experiment.step_limit import StepLimit, limit_for
from gpudiag.experiment.trial import GlobalState
from gpudiag.fixes import Fix
from gpudiag.fixes.base import ambient, ordered, transform
from gpudiag.fixes.proof import Observation, Proof, ProofStatus, not_applied
from gpudiag.probe import cuda
from gpudiag.profiling.census import compiled_regions, dynamo_counts, op_census
from gpudiag.step import Step, Workload, grad_norm, loss_value

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

__all__ = ["Arm", "grad_norm", "load_values", "loss_value", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Same seed for torch (every device), Python and NumPy, so arms see the same randomness."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def load_values(model: Any, values: Mapping[str, Any]) -> None:
    """Copy snapshot values into a model's parameters and buffers by name (same architecture)."""
    import torch

    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in values:
                t.copy_(values[name])
        model.zero_grad(set_to_none=True)


@dataclass
class Arm:
    """A label, its fixes, and the private Step they transform."""

    label: str
    fixes: tuple[Fix, ...]
    workload: Workload
    base_model: Any  # the arm's model before any wrapper (a deep copy, or the user's model)
    shared: bool  # the model is shared with other arms: model-level fixes apply per sample
    device_type: str
    system: SystemReport | None = None
    target: Step = field(default_factory=Step)
    samples_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    first_step_s: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)
    # Samples in one optimizer step of this arm (a batch fix changes it), fixed at open().
    samples_per_step: int = 0
    # Proof of effect: what the arm's own (untimed) step showed, and each fix's proof.
    observation: Observation | None = None
    proofs: tuple[Proof, ...] = ()
    # Dynamo's counters (frames compiled, graph breaks) summed over this arm's calls.
    dynamo: Counter[str] = field(default_factory=Counter)
    # How long a step may run (shared by the arms of one run: later steps are limited from
    # the run's first step; default: the workload's own); whether this arm has stepped yet.
    limit: StepLimit | None = None
    # The arm's steps run on fake tensors (a traced estimate): they never set the reference.
    fake: bool = False
    _stepped: bool = False

    def __post_init__(self) -> None:
        if self.limit is None:
            self.limit = limit_for(self.workload, fake=self.fake)

    @property
    def _limit(self) -> StepLimit:
        assert self.limit is not None  # set in __post_init__
        return self.limit

    @property
    def is_baseline(self) -> bool:
        return not self.fixes

    @property
    def not_applied(self) -> tuple[Proof, ...]:
        """The proofs of the fixes that did not take effect (the arm is not judged then)."""
        return tuple(p for p in self.proofs if p.status is ProofStatus.NOT_APPLIED)

    # -- lifetime -----------------------------------------------------------------------
    @property
    def runs(self) -> bool:
        """The arm is still run: no error, and no fix of it found not to take effect."""
        return self.error is None and not self.not_applied

    def open(self, *, refusal_is_not_applied: bool = False) -> None:
        """Build the arm's Step and apply its structural fixes (on a shared model, around
        each call instead). With ``refusal_is_not_applied``, a fix that refuses the model
        (UnsupportedFixError: no repeated blocks to checkpoint, nothing to compile, ...) makes
        the arm "not applied" with that reason instead of raising; a shared arm is tried
        once, and undone, to know it before any step runs."""
        self.target = Step.of(
            self.workload,
            self.base_model,
            device_type=self.device_type,
            system=self.system,
            per_sample=self.shared,
        )
        if not self.shared:
            self._transform(self._stack, refusal_is_not_applied)
        elif refusal_is_not_applied:
            with ExitStack() as dry_run:
                self._transform(dry_run, True)
        self.samples_per_step = self.target.samples_per_step()
        self.reset_batches()

    def _transform(self, stack: ExitStack, refusal_is_not_applied: bool) -> None:
        if not refusal_is_not_applied:
            transform(self.target, self.fixes, stack)
            self._collect_notes()
            return
        refused = []
        for fix in ordered(self.fixes):
            try:
                transform(self.target, (fix,), stack)
            except UnsupportedFixError as exc:
                refused.append(not_applied(fix.label, str(exc)))
        self._collect_notes()
        if refused:
            self.proofs = tuple(refused)

    def reset_batches(self) -> None:
        """Start the batches again (a dataloader re-shuffles from the current RNG state)."""
        self.target.open()

    def close(self) -> None:
        self._collect_notes()  # fixes may note what happened while stepping
        self._stack.close()
        self.target.close()

    def _collect_notes(self) -> None:
        for note in self.target.notes:
            if note not in self.notes:
                self.notes.append(note)

    def new_optimizer(self) -> None:
        self.target.new_optimizer()

    @contextmanager
    def active(self) -> Iterator[None]:
        """The arm's switches (and, on a shared model, its model-level changes) for a while."""
        before = dynamo_counts()
        try:
            with ExitStack() as stack:
                if self.shared:
                    transform(self.target, self.fixes, stack)
                    self._collect_notes()
                stack.enter_context(ambient(self.target, self.fixes))
                yield
        finally:
            after = dynamo_counts()
            self.dynamo.update({k: v - before.get(k, 0) for k, v in after.items()})

    def prove(self, baseline: Observation | None) -> Observation:
        """One untimed step of the arm, observed, and each fix's proof of effect from it.

        The step's operators are counted (``op_census``) unless a fix bypasses the dispatcher
        (compiled code), whose arm is run under the profiler instead (``compiled_regions``);
        torch's switches and the environment are read inside the arm. The proofs are taken
        while the arm is active: a shared arm's structural changes exist only then.
        """
        with self.active():
            state = GlobalState.capture(env=False)
            ops = compiled = None
            missing = ""
            if any(f.spec.bypasses_dispatcher for f in self.fixes):
                compiled, _ = compiled_regions(self._limited_run)
                missing = "compiled code does not pass through the dispatcher"
            else:
                ops, _ = op_census(self._limited_run)
            observation = Observation(
                step=self.target,
                ops=ops,
                ops_missing=missing,
                compiled=compiled,
                switches=dict(state.switches),
                environ=dict(os.environ),
                dynamo=dict(self.dynamo),
            )
            self.proofs = tuple(f.proof(observation, baseline) for f in self.fixes)
        self.observation = observation
        self._collect_notes()
        return observation

    # -- stepping -----------------------------------------------------------------------
    def _slow_first(self) -> bool:
        """The next step is this arm's first, and one of its fixes compiles or captures then."""
        return not self._stepped and any(f.spec.slow_first_step for f in self.fixes)

    def step(self, record: bool = False) -> tuple[float | None, float | None]:
        """One training step within the step limit; with ``record``, its loss and gradient
        norm (costs a sync)."""
        first = not self._stepped
        t0 = time.perf_counter()
        with self._limit.guard(self.label, first=self._slow_first()):
            out = self.target.run(record)
        self._finished_steps(first, time.perf_counter() - t0)
        return out

    def _limited_run(self) -> None:
        """One step within the step limit (the proof's observed step runs this)."""
        self.step()

    def _finished_steps(self, first: bool, seconds_per_step: float) -> None:
        self._stepped = True
        if first:
            self._limit.observe_first(seconds_per_step)

    def trace(self, steps: int, clock: Callable[[], float]) -> StepTrace:
        """Seeded steps recording loss and gradient norm; the first step's time is kept."""
        losses: list[float | None] = []
        norms: list[float | None] = []
        with self.active():
            for i in range(steps):
                first = not self._stepped
                t0 = clock()
                with self._limit.guard(self.label, first=self._slow_first()):
                    loss, norm = self.target.run(record=True)
                    if i == 0 and self.first_step_s is None:
                        cuda.synchronize()
                        self.first_step_s = clock() - t0
                self._finished_steps(first, self.first_step_s or (clock() - t0))
                losses.append(loss)
                norms.append(norm)
        return StepTrace(tuple(losses), tuple(norms))

    def timed(self, steps: int, clock: Callable[[], float] | None) -> float:
        """Seconds per step over ``steps`` consecutive steps (device time on CUDA)."""
        first = not self._stepped
        slow = self._slow_first()
        with self.active(), self._limit.guard(self.label, first=slow, steps=steps):
            if clock is None:
                with cuda.device_timer() as elapsed:
                    for _ in range(steps):
                        self.target.run()
                seconds = elapsed[0]
            else:
                t0 = clock()
                for _ in range(steps):
                    self.target.run()
                cuda.synchronize()
                seconds = clock() - t0
        self._finished_steps(first, seconds / steps)
        return seconds / steps
