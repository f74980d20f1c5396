"""How long a trial lets one training step run before it calls the step hung.

The limit is generous and follows the workload: the run's first step (lazy initialisation,
autotuning, the first batches of a DataLoader) and the first step of an arm whose fix compiles
or captures (``FixSpec.slow_first_step``: compile, cuda.graphs, fp8) get ``FIRST_STEP_S``;
every other step gets ``FACTOR`` times the run's first step (the baseline's), and at least
``FLOOR_S``. ``gd.Workload(..., step_timeout_s=S)`` sets one fixed limit for every step
instead; ``step_timeout_s=math.inf`` turns the limit off. A step past its limit is interrupted
with ``StepTimeoutError`` (gpudiag._deadline says how, and what cannot be interrupted); the
trial restores the user's state as after any failure.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag._deadline import deadline

if TYPE_CHECKING:
    from gpudiag.step import Workload

FIRST_STEP_S = 300.0
FACTOR = 10.0
FLOOR_S = 30.0


@dataclass
class StepLimit:
    """The step limit of one run (shared by all its arms); ``fixed_s`` from the workload."""

    fixed_s: float | None = None
    reference_s: float | None = None  # the first step measured in this run
    # Steps traced on fake tensors: without a reference of their own, a real step's (slower
    # than theirs, so a generous limit for them).
    fallback: StepLimit | None = None

    @classmethod
    def of(cls, workload: Workload) -> StepLimit:
        return cls(fixed_s=workload.step_timeout_s)

    def seconds(self, *, first: bool = False, steps: int = 1) -> float:
        """The limit for ``steps`` consecutive steps (``first``: they begin with a first step
        that may compile or capture)."""
        if self.fixed_s is not None:
            return self.fixed_s * steps
        fallback = self.fallback
        if self.reference_s is None and fallback is not None and fallback.reference_s is not None:
            return fallback.seconds(first=first, steps=steps)
        if self.reference_s is None:
            return FIRST_STEP_S * steps
        if first:
            return FIRST_STEP_S + (steps - 1) * self._later()
        return self._later() * steps

    def _later(self) -> float:
        assert self.reference_s is not None
        return max(FLOOR_S, FACTOR * self.reference_s)

    def observe_first(self, seconds: float) -> None:
        """The first step of the run took ``seconds``: later steps are limited from it."""
        if self.reference_s is None and math.isfinite(seconds) and seconds >= 0:
            self.reference_s = seconds

    def describe(self, *, first: bool = False) -> str:
        if self.fixed_s is not None:
            return f"the workload's step_timeout_s={self.fixed_s:g}"
        if first or self.reference_s is None:
            return (
                f"an arm's first step may take {FIRST_STEP_S:g} s; set "
                "gd.Workload(..., step_timeout_s=S) to change it"
            )
        return (
            f"{FACTOR:g}x the first step's {self.reference_s:.3g} s, at least {FLOOR_S:g} s; set "
            "gd.Workload(..., step_timeout_s=S) to change it"
        )

    @contextmanager
    def guard(self, what: str, *, first: bool = False, steps: int = 1) -> Iterator[None]:
        """Run ``steps`` steps of ``what`` (an arm's label) within their limit."""
        seconds = self.seconds(first=first, steps=steps)
        noun = "a step" if steps == 1 else f"{steps} steps"
        with deadline(seconds, f"{what}: {noun}", hint=f" ({self.describe(first=first)})"):
            yield


# The limits one measurement shares between the arms it builds (gd.memory, gd.fit, ...): one
# for real steps, one for steps traced on fake tensors (far faster than real ones, so never
# the reference for a real step).
_shared: contextvars.ContextVar[dict[bool, StepLimit] | None] = contextvars.ContextVar(
    "gpudiag_step_limits", default=None
)


@contextmanager
def shared_limits(workload: Workload) -> Iterator[None]:
    """Arms built inside the block share their step limits (unless one is given them): the
    first step measured anywhere in it limits the later ones."""
    if _shared.get() is not None:  # an enclosing measurement already shares them
        yield
        return
    real = StepLimit.of(workload)
    fake = StepLimit.of(workload)
    fake.fallback = real
    token = _shared.set({False: real, True: fake})
    try:
        yield
    finally:
        _shared.reset(token)


def limit_for(workload: Workload, *, fake: bool = False) -> StepLimit:
    """The shared limit inside ``shared_limits``, else a new one for ``workload``."""
    shared = _shared.get()
    return shared[fake] if shared is not None else StepLimit.of(workload)


def guarded(fn: Callable[[], Any], limit: StepLimit, what: str) -> Callable[[], Any]:
    """``fn`` (one step) run within ``limit`` on every call; its first call's time becomes the
    limit's reference. For code that runs a step outside a trial arm (profiling, a cell)."""
    calls = [0]

    def step() -> Any:
        t0 = time.perf_counter()
        with limit.guard(what):
            out = fn()
        if calls[0] == 0:
            limit.observe_first(time.perf_counter() - t0)
        calls[0] += 1
        return out

    step.__name__ = str(getattr(fn, "__name__", "step"))
    return step


__all__ = [
    "FACTOR",
    "FIRST_STEP_S",
    "FLOOR_S",
    "StepLimit",
    "guarded",
    "limit_for",
    "shared_limits",
]
