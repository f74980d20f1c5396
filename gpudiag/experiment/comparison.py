"""A comparison's results: ``ArmResult`` (one arm) and ``Comparison`` (baseline vs fixes), their
accessors, text, HTML card and dict. The protocol that measures them is
:mod:`gpudiag.experiment.compare`; their figure is built in ``gpudiag.plots.compare``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.analysis.stats import Measurement, SpeedupEstimate
from gpudiag.analysis.verdict import NOT_APPLIED, UNDECIDED, Judgement
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.drift import Drift
from gpudiag.experiment.memory import PeakMemory
from gpudiag.fixes import Fix, Proof, ProofStatus
from gpudiag.units import CELL, format_seconds

if TYPE_CHECKING:
    from gpudiag.probe.contention import MachineLoad

FixLike = Fix | str
ArmSpec = FixLike | Sequence[FixLike]


# A memory fix (FixSpec.saves_memory) is kept when it cuts peak memory by this share or more.
MEMORY_KEEP = 0.10


@dataclass(frozen=True)
class ArmResult:
    """What one arm measured. ``speedup`` / ``verdict`` are vs the baseline (None for it).

    ``verdict``: 'faster' | 'slower' | 'no significant difference' | 'undecided' |
    'not applied' (a fix did not take effect: never timed, never judged, never in a recipe),
    None for the baseline and for an arm that failed (``error``). ``judgement``: the look the
    verdict came from, with what an undecided arm would need. ``proofs``: each fix's proof of
    effect from the arm's own step; a verdict whose fixes are not all proven is "unverified"
    (``verified`` False, said beside it).
    """

    label: str
    fixes: tuple[Fix, ...]
    step_time: Measurement
    samples_per_step: int
    tokens_per_sample: int | None
    memory: PeakMemory | None
    drift: Drift | None
    speedup: SpeedupEstimate | None
    verdict: str | None
    stop_reason: str
    first_step_s: float | None
    error: str | None = None
    notes: tuple[str, ...] = ()
    proofs: tuple[Proof, ...] = ()
    judgement: Judgement | None = None

    @property
    def is_baseline(self) -> bool:
        return not self.fixes

    @property
    def applied(self) -> bool:
        """No fix of the arm was shown not to take effect."""
        return not any(p.status is ProofStatus.NOT_APPLIED for p in self.proofs)

    @property
    def verified(self) -> bool:
        """Every fix of the arm was shown to take effect."""
        return bool(self.proofs) and all(p.status is ProofStatus.APPLIED for p in self.proofs)

    @property
    def not_applied_reason(self) -> str:
        """Why the arm's fixes did not take effect, with the change to make by hand."""
        named = len(self.fixes) > 1  # a combination names the fix each reason is about
        return "; ".join(
            _proof_text(p, named) for p in self.proofs if p.status is ProofStatus.NOT_APPLIED
        )

    @property
    def unverified_reason(self) -> str:
        return "; ".join(
            f"{p.fix}: {p.reason}" for p in self.proofs if p.status is ProofStatus.UNVERIFIED
        )

    @property
    def needs(self) -> str:
        """What an undecided arm would need to be decided ("" otherwise)."""
        return self.judgement.needs if self.judgement is not None else ""

    @property
    def samples_per_s(self) -> float | None:
        median = self.step_time.median_s
        if not self.samples_per_step or not median or not math.isfinite(median):
            return None
        return self.samples_per_step / median

    @property
    def tokens_per_s(self) -> float | None:
        sps = self.samples_per_s
        return None if sps is None or not self.tokens_per_sample else sps * self.tokens_per_sample

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "label": self.label,
                "fixes": [f.to_dict() for f in self.fixes],
                "step_time": self.step_time,
                "samples_per_s": self.samples_per_s,
                "tokens_per_s": self.tokens_per_s,
                "memory": self.memory,
                "drift": self.drift,
                "speedup": self.speedup,
                "verdict": self.verdict,
                "stop_reason": self.stop_reason,
                "first_step_s": self.first_step_s,
                "error": self.error,
                "notes": list(self.notes),
                "proofs": [p.to_dict() for p in self.proofs],
                "verified": self.verified,
                "judgement": self.judgement,
            }
        )


def _proof_text(proof: Proof, named: bool) -> str:
    text = f"{proof.fix}: {proof.reason}" if named else proof.reason
    return text + (f". By hand: {proof.manual}" if proof.manual else "")


@dataclass(frozen=True)
class Comparison(Carded):
    """Baseline vs fixes on one workload: per-step times, throughput, memory, drift, verdicts."""

    workload: str
    workload_description: str
    device: str
    hardware: str
    baseline: ArmResult
    arms: tuple[ArmResult, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    rounds: int = 0
    steps_per_sample: int = 1
    adaptive: bool = True
    stop_reason: str = ""
    elapsed_s: float = 0.0
    measuring_s: float = 0.0
    confidence: float = 0.95
    tolerance: float = 0.01
    isolation: str = ""
    notes: tuple[str, ...] = ()
    created_at: str = ""
    system: dict[str, Any] = field(default_factory=dict)
    # How verdicts were reached (VerdictPlan.describe()): confidence over the planned looks,
    # tolerance, equivalence margin.
    verdict_rule: str = ""
    # How busy the machine was during the timed rounds (real timings only; None with an
    # injected clock): a busy machine turns "no significant difference" into "undecided".
    machine_load: MachineLoad | None = None

    # -- accessors ------------------------------------------------------------------------
    def _measured(self) -> list[ArmResult]:
        return [
            a
            for a in self.arms
            if a.speedup is not None and a.error is None and a.verdict != NOT_APPLIED
        ]

    def arm(self, fix: Any = None) -> ArmResult:
        """The arm for ``fix`` (a Fix, its text, or a list of fixes for a combination).

        ``None``: the only measured arm, or the one with the highest speedup.
        """
        if fix is None:
            measured = self._measured()
            if not measured:
                reasons = [f"{label}: {why}" for label, why in self.skipped]
                reasons += [
                    f"{a.label}: {_verdict_text(a)}" for a in self.arms if not a.is_baseline
                ]
                raise GpuDiagError(
                    "no fix was measured in this comparison "
                    f"({'; '.join(reasons) or 'no fixes were given'})"
                )
            return max(measured, key=lambda a: a.speedup.value if a.speedup else -math.inf)
        for a in self.arms:
            if isinstance(fix, str) and a.label == fix:
                return a
        wanted = fixes_of(fix)
        for a in self.arms:
            if set(a.fixes) == set(wanted):
                return a
        for label, why in self.skipped:
            if label == "+".join(f.label for f in wanted):
                raise GpuDiagError(f"{label} was not measured: {why}")
        known = ", ".join(a.label for a in self.arms) or "none"
        raise GpuDiagError(f"no arm for {fix!r} in this comparison; measured arms: {known}")

    def speedup(self, fix: Any = None) -> SpeedupEstimate:
        """Baseline step time / fix step time, with ``.value``, ``.low`` and ``.high``."""
        a = self.arm(fix)
        if a.speedup is None:
            raise GpuDiagError(f"{a.label} has no speedup: {a.error or 'it was not measured'}")
        return a.speedup

    def verdict(self, fix: Any = None) -> str:
        """'faster', 'slower', 'no significant difference', 'undecided' (not enough evidence,
        or a busy machine) or 'not applied' for ``fix`` vs the baseline."""
        a = self.arm(fix)
        if a.verdict is None:
            raise GpuDiagError(f"{a.label} has no verdict: {a.error or 'it was not measured'}")
        return a.verdict

    def kept(self) -> list[ArmResult]:
        """Arms worth keeping, with acceptable drift: faster ones, and those of memory fixes
        (activation checkpointing) that cut peak memory by ``MEMORY_KEEP`` or more."""
        return [
            a
            for a in self._measured()
            if a.applied
            and (a.verdict == "faster" or self.memory_saving(a) >= MEMORY_KEEP)
            and (a.drift is None or a.drift.status in ("ok", "not measured"))
        ]

    def memory_saving(self, arm: ArmResult) -> float:
        """Share of the baseline's peak memory a memory fix saves (0 for other fixes, or
        when either peak was not measured)."""
        if not any(f.spec.saves_memory for f in arm.fixes):
            return 0.0
        peak = arm.memory.peak_bytes if arm.memory else None
        base = self.baseline.memory.peak_bytes if self.baseline.memory else None
        if not peak or not base:
            return 0.0
        return max(0.0, 1.0 - peak / base)

    def recipe(self, *, include: Iterable[Any] | None = None) -> Any:
        """A gd.Recipe of the fixes that made it faster (or, for memory fixes, smaller)
        without large drift, with their evidence.

        ``include`` picks arms explicitly (Fix objects, texts) instead; an arm whose fix did not
        take effect is refused.
        """
        from gpudiag.recipe import Recipe

        arms = [self.arm(f) for f in include] if include is not None else self.kept()
        for a in arms:
            if not a.applied:
                raise GpuDiagError(
                    f"{a.label} did not take effect here ({a.not_applied_reason}): it cannot "
                    "enter a recipe"
                )
        return Recipe.from_comparison(self, arms)

    def plot(self) -> Any:
        return _views.build("figure", self)

    # -- presentation -----------------------------------------------------------------------
    def rows(self) -> list[list[str]]:
        out = []
        for a in (self.baseline, *self.arms):
            st = a.step_time
            # One sample has no spread: its IQR of 0 would read as "perfectly steady".
            spread = f"{st.relative_spread:.0%}" if st.n >= 2 else "n/a"
            sps = a.samples_per_s
            tps = a.tokens_per_s
            throughput = (f"{tps:,.0f} tok/s" if tps else f"{sps:,.1f} samples/s") if sps else "n/a"
            out.append(
                [
                    a.label,
                    format_seconds(st.median_s, CELL) if st.n else "n/a",
                    spread,
                    throughput,
                    "baseline" if a.is_baseline else (str(a.speedup) if a.speedup else "n/a"),
                    "" if a.is_baseline else _verdict_cell(a),
                    str(a.memory) if a.memory else "n/a",
                    "" if a.is_baseline else (str(a.drift) if a.drift else "n/a"),
                ]
            )
        return out

    HEADER = (
        "arm",
        "median step",
        "IQR/median",
        "throughput",
        "speedup",
        "verdict",
        "peak memory",
        "drift",
    )

    def warnings(self) -> list[str]:
        """What to doubt in the result. Only rounds that ran are spoken of: a comparison
        whose fixes were all "not applied" timed nothing, so it has no load or spread to warn
        about."""
        out = []
        timed = any(a.step_time.n for a in (self.baseline, *self.arms))
        if timed and self.machine_load is not None and self.machine_load.busy:
            out.append(
                "the machine was busy during the timed rounds: "
                + "; ".join(self.machine_load.reasons())
            )
        for a in (self.baseline, *self.arms):
            if timed and a.verdict != NOT_APPLIED:  # never timed: reason said below the table
                out += [f"{a.label}: {w}" for w in a.step_time.warnings()]
            if a.drift is not None and a.drift.status in ("large", "non-finite"):
                out.append(
                    f"{a.label}: numerical drift is {a.drift.status} ({a.drift}): "
                    "check training quality"
                )
            if a.error:
                out.append(f"{a.label}: failed: {a.error}")
        return out

    def summary(self) -> str:
        parts = []
        for a in self.arms:
            if a.verdict == NOT_APPLIED:
                parts.append(f"{a.label}: not applied")
            elif a.speedup is not None and a.verdict is not None:
                label = "" if a.verified else " (unverified)"
                parts.append(f"{a.label}: {a.verdict}{label}, {a.speedup}")
        return "; ".join(parts) or "no fix measured"

    def evidence_lines(self) -> list[str]:
        """Per arm, below the table: a verdict that needs words (not applied with the reason
        and the change by hand, undecided with what it needs, unverified with why), then
        what its fixes' proofs saw."""
        out = []
        for a in self.arms:
            worded = a.verdict in (NOT_APPLIED, UNDECIDED) or not a.verified
            if a.error is None and a.verdict and worded:
                out.append(f"{a.label}: {_verdict_text(a)}")
            out += [
                f"{a.label}: proof: {p}" if len(a.fixes) > 1 else f"proof: {p}"
                for p in a.proofs
                if p.status is not ProofStatus.NOT_APPLIED
            ]
        return out

    def __repr__(self) -> str:
        widths = [
            max(len(str(r[i])) for r in [list(self.HEADER), *self.rows()])
            for i in range(len(self.HEADER))
        ]
        lines = [f"Comparison on {self.workload_description}", f"  {self.hardware}"]
        for row in [list(self.HEADER), *self.rows()]:
            lines.append(
                "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            )
        lines.append(
            f"  {self.rounds} rounds of {self.steps_per_sample} step(s) per arm, interleaved in "
            f"random order; stopped: {self.stop_reason}; {self.measuring_s:.1f} s measuring, "
            f"{self.elapsed_s:.1f} s in all; "
            f"{self.isolation}"
        )
        if self.verdict_rule:
            lines.append(f"  verdicts: {self.verdict_rule}")
        lines += [f"  skipped {label}: {why}" for label, why in self.skipped]
        lines += [f"  {line}" for line in self.evidence_lines()]
        lines += [f"  WARNING: {w}" for w in self.warnings()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        facts = Facts(
            [
                ("hardware", self.hardware),
                (
                    "protocol",
                    f"{self.rounds} rounds x {self.steps_per_sample} step(s), interleaved, "
                    "random order",
                ),
                ("stopped", self.stop_reason),
                ("time", f"{self.measuring_s:.1f} s measuring, {self.elapsed_s:.1f} s in all"),
                ("isolation", self.isolation),
                (
                    "statistics",
                    "speedup: median of per-round ratios, exact sign-test interval; "
                    + self.verdict_rule,
                ),
            ]
        )
        return Card(
            f"Comparison: {self.workload_description}",
            [
                Grid(self.HEADER, self.rows()),
                facts,
                Lines([f"skipped {label}: {why}" for label, why in self.skipped]),
                Lines(self.evidence_lines()),
                Lines(self.warnings(), "warning", prefix="WARNING: "),
                Lines(self.notes, "note", prefix="note: "),
            ],
            subtitle=self.summary(),
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "workload": self.workload,
                "workload_description": self.workload_description,
                "device": self.device,
                "hardware": self.hardware,
                "baseline": self.baseline,
                "arms": list(self.arms),
                "skipped": [{"label": label, "reason": why} for label, why in self.skipped],
                "rounds": self.rounds,
                "steps_per_sample": self.steps_per_sample,
                "adaptive": self.adaptive,
                "stop_reason": self.stop_reason,
                "elapsed_s": self.elapsed_s,
                "measuring_s": self.measuring_s,
                "confidence": self.confidence,
                "tolerance": self.tolerance,
                "isolation": self.isolation,
                "notes": list(self.notes),
                "warnings": self.warnings(),
                "created_at": self.created_at,
                "system": self.system,
                "verdict_rule": self.verdict_rule,
                "machine_load": (
                    None if self.machine_load is None else self.machine_load.to_dict()
                ),
            }
        )


def fixes_of(spec: ArmSpec) -> tuple[Fix, ...]:
    if isinstance(spec, (Fix, str)):
        return (Fix.coerce(spec),)
    if isinstance(spec, dict):
        return (Fix.coerce(spec),)
    if isinstance(spec, Iterable):
        return tuple(Fix.coerce(f) for f in spec)
    raise GpuDiagError(
        f"a fix must be a gd.Fix or its text (like 'precision.bf16'), got {type(spec).__name__}"
    )


def _verdict_cell(arm: ArmResult) -> str:
    """An arm's verdict as the table shows it: the verdict, marked when unverified (the
    words, why not applied, what an undecided arm needs, are below the table); or its error."""
    if arm.error:
        return f"error: {arm.error}"
    if arm.verdict and arm.verdict not in (NOT_APPLIED, UNDECIDED) and not arm.verified:
        return f"{arm.verdict} (unverified)"
    return arm.verdict or ""


def _verdict_text(arm: ArmResult) -> str:
    """An arm's verdict in words: why a fix was not applied (and the change by hand), what an
    undecided arm needs, "unverified" where no proof could tell; or its error."""
    if arm.error:
        return f"error: {arm.error}"
    if arm.verdict == NOT_APPLIED:
        return f"not applied: {arm.not_applied_reason}"
    if arm.verdict == UNDECIDED:
        return f"undecided: {arm.needs}" if arm.needs else UNDECIDED
    if arm.verdict and not arm.verified:
        return f"{arm.verdict}, unverified: {arm.unverified_reason or 'no proof of effect'}"
    return arm.verdict or ""


__all__ = ["MEMORY_KEEP", "ArmResult", "ArmSpec", "Comparison", "FixLike", "fixes_of"]
