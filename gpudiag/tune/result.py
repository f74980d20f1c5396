"""``TuneResult``: what ``gd.tune`` measured, the best arm, the path to it, what it did not reach.

Every arm the search measured is in ``history`` with its stage, rounds, time and, when it was
dropped, why. ``best`` is the last accepted arm: every fix of it proven to take effect, judged
faster than the baseline (and, for a combination, than the arm it grew from) in one
comparison; never an arm whose fix did not apply, never an undecided one, never the A/A control.
When nothing beat the baseline, ``best`` is the baseline (no fixes, no speedup).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.errors import GpuDiagError
from gpudiag.fixes import Fix

if TYPE_CHECKING:
    from gpudiag.analysis.stats import SpeedupEstimate
    from gpudiag.analysis.verdict import Judgement
    from gpudiag.experiment.comparison import Comparison
    from gpudiag.rules.engine import Diagnosis
    from gpudiag.tune.candidates import Candidate

# The arm's place in the search.
BEST = "best"  # the arm tune hands back
ACCEPTED = "accepted"  # a step on the path to the best (an earlier incumbent)
WINNER = "winner"  # faster than the baseline alone; waiting to be combined, or combined already
DROPPED = "dropped"  # out of the search, with the reason
CONTROL = "A/A control"  # the control arm: shows the test's false-verdict rate, never kept
RERACED = "raced again"  # undecided with an estimate above 1: given more rounds
MULTI_RANK = "on ranks"  # measured across ranks against DDP: beside the search, never best


@dataclass(frozen=True)
class TunedArm:
    """One arm as the search measured it.

    ``speedup`` / ``verdict``: against the baseline, in ``stage``'s comparison. ``versus``:
    for a combination, its judgement against the arm it grew from (``grew_from``), measured in
    the same rounds. ``timed_s``: seconds of its timed samples and first step in that stage.
    """

    label: str
    fixes: tuple[Fix, ...]
    stage: int
    stage_name: str
    status: str
    reason: str = ""
    source: str = ""
    verdict: str | None = None
    speedup: SpeedupEstimate | None = None
    verified: bool = False
    applied: bool = True
    rounds: int = 0
    timed_s: float = 0.0
    peak_memory_bytes: int | None = None
    drift: str = ""
    versus: Judgement | None = None
    grew_from: str = ""

    @property
    def is_baseline(self) -> bool:
        return not self.fixes and self.status != CONTROL

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "label": self.label,
                "fixes": [f.to_dict() for f in self.fixes],
                "stage": self.stage,
                "stage_name": self.stage_name,
                "status": self.status,
                "reason": self.reason,
                "source": self.source,
                "verdict": self.verdict,
                "speedup": self.speedup,
                "verified": self.verified,
                "applied": self.applied,
                "rounds": self.rounds,
                "timed_s": self.timed_s,
                "peak_memory_bytes": self.peak_memory_bytes,
                "drift": self.drift,
                "versus": self.versus,
                "grew_from": self.grew_from,
            }
        )


@dataclass(frozen=True)
class Stage:
    """One step of the search: a diagnosis, a race, a combination round or a re-diagnosis."""

    index: int
    name: str
    elapsed_s: float
    arms: tuple[str, ...] = ()
    confidence: float | None = None
    note: str = ""
    comparison: Comparison | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "index": self.index,
                "name": self.name,
                "elapsed_s": self.elapsed_s,
                "arms": list(self.arms),
                "confidence": self.confidence,
                "note": self.note,
                # The comparison's arms in short (its A/A arm's fix exists only during a
                # search, so the whole comparison is not serialised here).
                "comparison": None
                if self.comparison is None
                else {
                    "summary": self.comparison.summary(),
                    "rounds": self.comparison.rounds,
                    "stop_reason": self.comparison.stop_reason,
                    "verdict_rule": self.comparison.verdict_rule,
                    "warnings": self.comparison.warnings(),
                },
            }
        )


@dataclass
class SearchState:
    """Where the search stands: what a resumed search (``resume=previous``) continues from."""

    pending: list[Candidate] = field(default_factory=list)  # not raced yet
    promising: list[Candidate] = field(default_factory=list)  # undecided, worth more rounds
    multi_rank: list[Candidate] = field(default_factory=list)  # for the N-rank trial
    reraced: bool = False
    remaining: list[Candidate] = field(default_factory=list)  # winners not combined yet
    race_speedup: dict[str, float] = field(default_factory=dict)  # label -> race estimate
    incumbent: TunedArm | None = None
    incumbent_comparison: Comparison | None = None
    rediagnosed: str = ""  # the label of the arm last re-diagnosed
    stages: int = 0
    tests: int = 0  # measuring stages run (stage k's tests share alpha / 2**k)
    tried: set[Fix] = field(default_factory=set)
    # fixes a re-diagnosis put back to combine with the best (a fix raced alone against the
    # baseline may help the best arm, whose bottleneck is another one): once each
    rediagnosed_fixes: set[Fix] = field(default_factory=set)
    elapsed_s: float = 0.0

    @property
    def done(self) -> bool:
        busy = self.pending or (self.promising and not self.reraced) or self.remaining
        return not (busy or self.multi_rank) and (
            self.incumbent is None or self.rediagnosed == self.incumbent.label
        )

    def open_work(self) -> list[str]:
        """What the search has not done yet, in words."""
        out = []
        if self.pending:
            out.append("race " + ", ".join(c.label for c in self.pending))
        if self.promising and not self.reraced:
            out.append("more rounds for " + ", ".join(c.label for c in self.promising))
        if self.remaining and self.incumbent is not None:
            out.append(
                f"combine {self.incumbent.label} with " + ", ".join(c.label for c in self.remaining)
            )
        if self.incumbent is not None and self.rediagnosed != self.incumbent.label:
            out.append(f"re-diagnose {self.incumbent.label}")
        if self.multi_rank:
            out.append("the multi-rank trial of " + ", ".join(c.label for c in self.multi_rank))
        return out


@dataclass(frozen=True)
class TuneResult:
    """``gd.tune``'s answer: ``.best``, ``.history``, ``.recipe()``, ``.plot()``."""

    workload: str
    workload_description: str
    hardware: str
    budget_s: float
    elapsed_s: float
    best: TunedArm
    history: tuple[TunedArm, ...]
    stages: tuple[Stage, ...]
    candidates: tuple[Candidate, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    not_reached: tuple[str, ...] = ()
    next_bottleneck: tuple[str, ...] = ()
    error_control: str = ""
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    diagnosis: Diagnosis | None = field(default=None, repr=False, compare=False)
    best_comparison: Comparison | None = field(default=None, repr=False, compare=False)
    state: SearchState | None = field(default=None, repr=False, compare=False)

    # -- accessors --------------------------------------------------------------------------
    @property
    def path(self) -> tuple[TunedArm, ...]:
        """The accepted steps from the baseline to ``best``, in order."""
        return tuple(a for a in self.history if a.status in (ACCEPTED, BEST))

    @property
    def finished(self) -> bool:
        """The search ran out of things to try (not out of time)."""
        return not self.not_reached

    def dropped(self) -> list[TunedArm]:
        return [a for a in self.history if a.status == DROPPED]

    def recipe(self) -> Any:
        """A gd.Recipe of ``best``'s fixes only, each with the evidence of the comparison in
        which ``best`` was accepted (its speedup, interval, proof, drift, memory)."""
        if self.best.is_baseline or self.best_comparison is None:
            raise GpuDiagError(
                "no fix beat the baseline in this search, so there is no recipe: see "
                ".history for why each arm was dropped"
                + ("; resume it with more time: gd.tune(..., resume=result)"
                   if self.not_reached else "")
            )  # fmt: skip
        return self.best_comparison.recipe(include=[list(self.best.fixes)])

    def plot(self) -> Any:
        """The path from the baseline to ``best`` (speedup per accepted step with its
        interval) and the seconds spent per arm."""
        return _views.build("figure", self)

    # -- presentation -----------------------------------------------------------------------
    HEADER = ("stage", "arm", "status", "verdict", "speedup", "rounds", "timed", "why / source")

    def rows(self) -> list[list[str]]:
        out = []
        for a in self.history:
            why = a.reason or a.source
            if a.versus is not None and a.grew_from:
                why = f"vs {a.grew_from}: {a.versus}" + (f"; {a.reason}" if a.reason else "")
            out.append(
                [
                    f"{a.stage} {a.stage_name}",
                    a.label,
                    a.status,
                    (a.verdict or "") + ("" if a.verified or not a.verdict else " (unverified)"),
                    str(a.speedup) if a.speedup is not None else "n/a",
                    str(a.rounds),
                    f"{a.timed_s:.1f} s",
                    why,
                ]
            )
        return out

    def summary(self) -> str:
        if self.best.is_baseline:
            return "nothing beat the baseline" + (
                " (the budget ran out first)" if self.not_reached else ""
            )
        return f"best: {self.best.label}, {self.best.verdict}, {self.best.speedup}"

    def _facts(self) -> list[tuple[str, str]]:
        spent = f"{self.elapsed_s:.1f} s of a {self.budget_s:.0f} s budget"
        facts = [
            ("hardware", self.hardware),
            ("time", spent),
            (
                "stages",
                "; ".join(
                    f"{s.index} {s.name} {s.elapsed_s:.1f} s"
                    + (f" ({s.note})" if s.note and s.comparison is None and s.index > 1 else "")
                    for s in self.stages
                ),
            ),
            ("statistics", self.error_control),
        ]
        if self.not_reached:
            facts.append(("not reached", "; ".join(self.not_reached)))
        if self.next_bottleneck:
            facts.append(("next bottleneck", "; ".join(self.next_bottleneck)))
        return facts

    def __repr__(self) -> str:
        rows = [list(self.HEADER), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER) - 1)]
        lines = [f"Tune on {self.workload_description}: {self.summary()}"]
        for r in rows:
            cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
            lines.append("  " + "  ".join([*cells, r[-1]]).rstrip())
        lines += [f"  {k}: {v}" for k, v in self._facts()]
        lines += [f"  skipped {label}: {why}" for label, why in self.skipped]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        body = html_grid(self.HEADER, self.rows()) + html_table(self._facts())
        body += "".join(f"<div>skipped {esc(lbl)}: {esc(why)}</div>" for lbl, why in self.skipped)
        body += "".join(
            f"<div style='color:#b45309'>WARNING: {esc(w)}</div>" for w in self.warnings
        )
        body += "".join(f"<div style='opacity:.7'>note: {esc(n)}</div>" for n in self.notes)
        return card(f"Tune: {self.workload_description}", body, subtitle=self.summary())

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "workload": self.workload,
                "workload_description": self.workload_description,
                "hardware": self.hardware,
                "budget_s": self.budget_s,
                "elapsed_s": self.elapsed_s,
                "summary": self.summary(),
                "best": self.best,
                "path": [a.label for a in self.path],
                "history": list(self.history),
                "stages": list(self.stages),
                "candidates": [c.to_dict() for c in self.candidates],
                "skipped": [{"label": lbl, "reason": why} for lbl, why in self.skipped],
                "not_reached": list(self.not_reached),
                "next_bottleneck": list(self.next_bottleneck),
                "error_control": self.error_control,
                "notes": list(self.notes),
                "warnings": list(self.warnings),
            }
        )


__all__ = [
    "ACCEPTED",
    "BEST",
    "CONTROL",
    "DROPPED",
    "MULTI_RANK",
    "RERACED",
    "WINNER",
    "Stage",
    "TuneResult",
    "TunedArm",
]
