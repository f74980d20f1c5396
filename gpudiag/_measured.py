"""What this process measured that advice depends on: one answer per question, for every reader.

Two kinds of answer live here, each recorded by the code that measured it and read by every
consumer, so one process never gives two answers to one question:

* machine facts (``fact(name)``): a micro-benchmark's answer with its interval, such as
  whether bf16 matmuls beat fp32 on this CPU (``gpudiag.bench.cpu_bf16`` records
  ``"cpu_bf16_speed"`` once per process, and ``"workload_bf16_speed"``, the latest
  diagnosed step's own matmuls). ``gd.inspect`` and the precision rules read the same objects.
* trials (``trial(subject, workload, fix_id)``): what ``gd.compare`` measured for one fix on
  a workload. A trial of a fix on the user's own step outranks any micro-benchmark's
  prediction about that fix: the rules and a diagnosis read it before their own estimate.

A trial is matched to a workload by the object it ran (the workload's model, or its step
function, held weakly: a new model is a new question) and the workload's description.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any

# Verdicts that answer "did the fix help here?"; others ("undecided", "not applied", a failed
# arm) leave the question open, so advice from a prediction stands.
DECISIVE = ("faster", "slower", "no significant difference")

_facts: dict[str, Any] = {}
_trials: list[MeasuredTrial] = []


def record_fact(name: str, value: Any) -> None:
    """Keep ``value`` as this process's answer to ``name`` (a new measurement replaces it)."""
    _facts[name] = value


def fact(name: str) -> Any | None:
    """The answer measured in this process, or None when nothing measured it yet."""
    return _facts.get(name)


@dataclass(frozen=True)
class MeasuredTrial:
    """One arm of a ``gd.compare`` on a workload: its fix, verdict and speedup with interval."""

    workload: str  # the workload's description
    fix: str  # the arm's label ("precision.bf16")
    fix_ids: tuple[str, ...]
    verdict: str
    speedup: str  # "0.85x (95% CI 0.82-0.86x)"
    rounds: int
    created_at: str = ""
    subject: Any = field(default=None, repr=False, compare=False)  # weakref to what ran

    @property
    def decisive(self) -> bool:
        """The verdict answers whether the fix helped (faster, slower, no difference)."""
        return self.verdict in DECISIVE

    @property
    def source(self) -> str:
        when = f", {self.created_at.replace('T', ' ')}" if self.created_at else ""
        return f"gd.compare on this workload in this process ({self.rounds} rounds{when})"

    def __str__(self) -> str:
        return f"{self.fix} measured {self.verdict} on this step: {self.speedup}"


def _ref(subject: Any) -> Any:
    try:
        return weakref.ref(subject)
    except TypeError:  # not weakly referable: matched by description alone
        return None


def record_trial(subject: Any, trial: MeasuredTrial) -> None:
    """Keep what a comparison measured for one fix on ``subject`` (its model or step)."""
    _trials.append(dataclasses.replace(trial, subject=_ref(subject)))


def trial(subject: Any, workload: str, fix_id: str) -> MeasuredTrial | None:
    """The latest trial of ``fix_id`` alone on this subject and workload, or None."""
    for measured in reversed(_trials):
        if measured.workload != workload or measured.fix_ids != (fix_id,):
            continue
        ran = measured.subject() if measured.subject is not None else None
        if measured.subject is None or ran is subject:
            return measured
    return None


def forget() -> None:
    """Drop every fact and trial (tests; a process that changed its machine)."""
    _facts.clear()
    _trials.clear()
