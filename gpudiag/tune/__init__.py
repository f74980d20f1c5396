"""``gd.tune``: the closed loop from a diagnosis to the best measured recipe (above ``doctor``).

``search`` runs it (diagnose, race, combine, re-diagnose, within a time budget), ``candidates``
says what is worth trying and why, ``result`` holds what was measured (``TuneResult``).
"""

from __future__ import annotations

from gpudiag.tune.candidates import Candidate
from gpudiag.tune.result import Stage, TunedArm, TuneResult
from gpudiag.tune.search import tune

__all__ = ["Candidate", "Stage", "TuneResult", "TunedArm", "tune"]
