"""A fake world for gd.tune: fixes whose effect on a fake-clock step is known exactly.

Each fix is an ambient spec registered for the test (``worlds``): while its context is
entered around the arm's step, the step "takes" its factor of the baseline's 10 ms on the
fake clock. Its proof counts the entries (as ``control.none`` does), so a fix whose context
is never entered is "not applied".
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import FixSpec, Step, registered
from gpudiag.step import Workload

BASE_S = 0.010
ACTIVE: dict[str, float] = {}  # fix id -> its factor, while its context is entered
LOSS: dict[str, float] = {}  # fix id -> what it adds to the loss (drift)
RAISE: dict[str, BaseException] = {}  # fix id -> what the step raises while it is entered


class _Timed(FixSpec):
    factor: ClassVar[float] = 1.0
    enters: ClassVar[bool] = True
    loss_shift: ClassVar[float] = 0.0
    summary = "a fix of the fake world"

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        return self._entered(target)

    @contextmanager
    def _entered(self, target: Step) -> Iterator[None]:
        if not self.enters:
            yield
            return
        target.state[self.id] = int(target.state.get(self.id, 0)) + 1
        ACTIVE[self.id] = self.factor
        LOSS[self.id] = self.loss_shift
        try:
            yield
        finally:
            ACTIVE.pop(self.id, None)
            LOSS.pop(self.id, None)

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        if not arm.step.state.get(self.id):
            return not_applied(self.id, "its context was never entered around the arm's step")
        return applied(self.id, "its context was entered around the arm")


class Halve(_Timed):
    id = "test.halve"
    group = "shape"
    factor = 0.5


class Clash(_Timed):
    id = "test.clash"
    group = "shape"  # conflicts with test.halve: one fix of a group per arm
    factor = 0.6


class Trim(_Timed):
    id = "test.trim"
    factor = 0.7


class Never(_Timed):
    id = "test.never"
    factor = 0.2
    enters = False  # never reaches the step: not applied


class Drifts(_Timed):
    id = "test.drifts"
    factor = 0.3  # the fastest, but it changes the numbers
    loss_shift = 5.0


class Slows(_Timed):
    id = "test.slows"
    factor = 1.6


class Boom(_Timed):
    id = "test.boom"
    factor = 0.9


class Exclusive(_Timed):
    id = "test.exclusive"
    factor = 0.8

    def conflicts_with(
        self, params: Mapping[str, Any], other: FixSpec, other_params: Mapping[str, Any]
    ) -> str:
        return (
            "the fake world says these two cannot share a step" if other.id == "test.halve" else ""
        )


class AfterHalve(_Timed):
    id = "test.after_halve"
    factor = 1.3  # slower alone; with test.halve entered it takes 0.7 (fake_step)


SPECS = (Halve, Clash, Trim, Never, Drifts, Slows, Boom, Exclusive, AfterHalve)


@contextmanager
def world() -> Iterator[None]:
    with ExitStack() as stack:
        for spec in SPECS:
            stack.enter_context(registered(spec))
        yield
    ACTIVE.clear()
    LOSS.clear()
    RAISE.clear()


def fake_step(clock: Any, *, noise: float = 0.02, seed: int = 0) -> Workload:
    """A step of 10 ms times the factors of the fixes entered around it, with seeded
    jitter; its loss is 1.0 plus what a drifting fix adds."""
    rng = random.Random(seed)

    def step() -> float:
        for fix_id, exc in RAISE.items():
            if fix_id in ACTIVE:
                raise exc
        factor = 1.0
        for fix_id, f in ACTIVE.items():
            factor *= 0.7 if fix_id == AfterHalve.id and Halve.id in ACTIVE else f
        clock.advance(BASE_S * factor * (1.0 + rng.uniform(-noise, noise)))
        return 1.0 + sum(LOSS.values())

    return Workload.from_step(step, name="fake")
