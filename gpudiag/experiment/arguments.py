"""The numbers a comparison's caller passes (rounds, steps, budgets, levels): checked once, with
the field and its range in the error, before anything runs.

``gd.compare(drift_steps=10**9)`` would otherwise run a billion valid steps (no step is hung,
so no step limit stops it), and ``steps_per_sample=nan`` or ``min_rounds="x"`` would end in a
raw ``ValueError`` / ``TypeError`` deep inside the protocol.
"""

from __future__ import annotations

import math
from typing import Any

from gpudiag._values import finite_number, whole_number

# Far above any useful protocol, far below a run that never ends.
MAX_ROUNDS = 100_000
MAX_STEPS = 10_000


def check_compare(values: dict[str, Any]) -> None:
    """ArgumentError for the first out-of-range protocol argument of ``gd.compare``."""
    for name in ("min_rounds", "max_rounds"):
        whole_number(values[name], name, low=1, high=MAX_ROUNDS)
    for name in ("warmup_steps", "drift_steps"):
        whole_number(values[name], name, low=0, high=MAX_STEPS)
    if values.get("steps_per_sample") is not None:
        whole_number(values["steps_per_sample"], "steps_per_sample", low=1, high=MAX_STEPS)
    budget = values["time_budget_s"]
    if not (isinstance(budget, float) and math.isinf(budget) and budget > 0):
        finite_number(budget, "time_budget_s", low=0, low_open=True)
    finite_number(values["min_sample_s"], "min_sample_s", low=0, high=3600)
    finite_number(values["confidence"], "confidence", low=0, high=1, low_open=True)
    finite_number(values["tolerance"], "tolerance", low=0, high=1)
    if "equivalence" in values:  # the margin of "no significant difference"
        finite_number(values["equivalence"], "equivalence", low=0, high=1, low_open=True)
    whole_number(values["seed"], "seed", low=0)


__all__ = ["MAX_ROUNDS", "MAX_STEPS", "check_compare"]
