"""An A/A control: a fix that changes nothing, provably, for measuring false verdicts.

``control.none`` enters a context around the arm's calls that only counts its entries; its
proof is that count, read from the arm's own step. A comparison of it against the baseline
is an A/A comparison: any "faster" or "slower" is a false verdict, which
``benchmarks/aa_false_verdicts.py`` counts. It is not part of the fix vocabulary (findings and
recipes never name it): register it for a while with ``with registered(NoChange): ...``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import FixSpec, Step


@contextmanager
def _counted(target: Step, key: str) -> Iterator[None]:
    target.state[key] = int(target.state.get(key, 0)) + 1
    yield


class NoChange(FixSpec):
    id = "control.none"
    summary = "Changes nothing (an A/A control): the arm runs the baseline's step as it is."

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        return _counted(target, self.id)

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        entered = int(arm.step.state.get(self.id, 0))
        if not entered:
            return not_applied(self.id, "its context was never entered around the arm's step")
        return applied(self.id, f"its context was entered {entered} time(s) around the arm")


__all__ = ["NoChange"]
