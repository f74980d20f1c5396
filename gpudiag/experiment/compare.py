"""``gd.compare``: baseline and fixes in isolated, interleaved trials, with honest statistics.

Runs for real on the CPU. On a GPU, step times come from CUDA events and memory from the
caching allocator through gpudiag.probe.cuda: that path is untested on a real GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _measured, _views
from gpudiag._progress import ProgressFn, closed_on_error, finish, report, resolve
from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.analysis.stats import (
    NO_DIFFERENCE,
    AdaptiveRule,
    AdaptiveStopper,
    Measurement,
    SpeedupEstimate,
    describe_stop,
)
from gpudiag.analysis.verdict import NOT_APPLIED, UNDECIDED, Judgement, judge
from gpudiag.errors import FixError, GpuDiagError, StepExitError, StepTimeoutError
from gpudiag.experiment.arguments import check_compare
from gpudiag.experiment.busy import verdict_on
from gpudiag.experiment.drift import Drift, StepTrace, compare_traces, not_measured
from gpudiag.experiment.memory import PeakMemory, measure_peak_memory
from gpudiag.experiment.runner import Arm, load_values, seed_everything
from gpudiag.experiment.step_limit import StepLimit
from gpudiag.experiment.trial import isolated, tensor_bytes
from gpudiag.experiment.workload import Workload
from gpudiag.fixes import Fix, Proof, ProofStatus, check_conflicts
from gpudiag.fixes import _system as fix_system
from gpudiag.probe import contention, cuda

if TYPE_CHECKING:
    from gpudiag.probe.contention import MachineLoad
    from gpudiag.probe.system import SystemReport

FixLike = Fix | str
ArmSpec = FixLike | Sequence[FixLike]


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


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
class Comparison:
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
        wanted = _arm_fixes(fix)
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
            spread = f"{st.relative_spread:.0%}" if st.n else "n/a"
            sps = a.samples_per_s
            tps = a.tokens_per_s
            throughput = (f"{tps:,.0f} tok/s" if tps else f"{sps:,.1f} samples/s") if sps else "n/a"
            out.append(
                [
                    a.label,
                    _fmt_s(st.median_s) if st.n else "n/a",
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
        out = []
        if self.machine_load is not None and self.machine_load.busy:
            out.append(
                "the machine was busy during the timed rounds: "
                + "; ".join(self.machine_load.reasons())
            )
        for a in (self.baseline, *self.arms):
            if a.verdict != NOT_APPLIED:  # never timed: its reason is said below the table
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

    def _repr_html_(self) -> str:
        body = html_grid(self.HEADER, self.rows())
        facts = html_table(
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
        extra = "".join(
            f"<div>skipped {esc(label)}: {esc(why)}</div>" for label, why in self.skipped
        )
        extra += "".join(f"<div>{esc(line)}</div>" for line in self.evidence_lines())
        extra += "".join(
            f"<div style='color:#b45309'>WARNING: {esc(w)}</div>" for w in self.warnings()
        )
        extra += "".join(f"<div style='opacity:.7'>note: {esc(n)}</div>" for n in self.notes)
        return card(
            f"Comparison: {self.workload_description}",
            body + facts + extra,
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


def _arm_fixes(spec: ArmSpec) -> tuple[Fix, ...]:
    if isinstance(spec, (Fix, str)):
        return (Fix.coerce(spec),)
    if isinstance(spec, dict):
        return (Fix.coerce(spec),)
    if isinstance(spec, Iterable):
        return tuple(Fix.coerce(f) for f in spec)
    raise GpuDiagError(
        f"a fix must be a gd.Fix or its text (like 'precision.bf16'), got {type(spec).__name__}"
    )


def _hardware(system: SystemReport | None, device_type: str) -> tuple[str, dict[str, Any]]:
    host = fix_system.host(system)
    torch_info = getattr(host, "torch", None)
    version = torch_info.version.get("?") if torch_info is not None else "?"
    facts: dict[str, Any] = {"torch": version, "device_type": device_type}
    if device_type == "cuda":
        cc, name = fix_system.gpu_cc(system)
        facts.update(gpu=name, compute_capability=fix_system.cc_text(cc))
        return f"GPU {name} (compute capability {fix_system.cc_text(cc)}), torch {version}", facts
    cpu = host.cpu_model.get("unknown CPU") if host is not None else "unknown CPU"
    cores = host.logical_cores.get("?") if host is not None else "?"
    instructions = bool(getattr(host, "cpu_bf16_instructions", False))
    bf16 = " with bf16 instructions" if instructions else ""
    facts.update(cpu=cpu, logical_cores=cores, cpu_bf16_instructions=instructions)
    return f"CPU {cpu} ({cores} logical cores{bf16}), torch {version}", facts


def _available_bytes(system: SystemReport | None, device_type: str) -> int | None:
    if device_type == "cuda":
        info = cuda.mem_get_info()
        return None if info is None else info[0]
    host = fix_system.host(system)
    reading = getattr(host, "memory_available_bytes", None)
    return reading.get() if reading is not None else None


def compare(
    workload: Workload,
    fixes: Iterable[ArmSpec] = (),
    *,
    combine: bool = False,
    system: SystemReport | None = None,
    time_budget_s: float = 60.0,
    adaptive: bool = True,
    min_rounds: int = 5,
    max_rounds: int = 100,
    warmup_steps: int = 2,
    drift_steps: int = 3,
    min_sample_s: float = 0.05,
    steps_per_sample: int | None = None,
    measure_memory: bool = True,
    confidence: float = 0.95,
    tolerance: float = 0.01,
    equivalence: float = 0.05,
    copies: bool | None = None,
    seed: int = 0,
    progress: bool | ProgressFn = True,
    clock: Callable[[], float] | None = None,
    nproc: int | None = None,
    **distributed: Any,
) -> Comparison:
    """Run the baseline and each fix in isolated trials, interleaved, and compare them.

    ``fixes``: gd.Fix objects or their text (``"attention.backend=flash"``); a list inside the
    list is one arm with several fixes; ``combine`` adds an arm with all of them. Fixes this
    machine cannot take are skipped with the reason. Each arm runs on its own deep copy of the
    model when memory allows (``copies``), otherwise on the user's model, snapshot and
    restored; either way the user's state is restored and verified at the end.

    Protocol: a seeded drift check (``drift_steps`` from the same state and seeds), one step
    for peak memory, ``warmup_steps``, then rounds in which every arm runs
    ``steps_per_sample`` steps (chosen so a sample lasts ``min_sample_s``) in a fresh random
    order. Before the rounds, one untimed step of each arm proves that its fixes took effect
    (``FixSpec.proof``): an arm whose fix did not is "not applied", with the reason and the
    change to make by hand, and is neither timed nor judged. ``adaptive``: each arm is looked
    at on a planned schedule from ``min_rounds`` (gpudiag.analysis.verdict.VerdictPlan) and
    stops at the first look that decides it, or at ``time_budget_s`` / ``max_rounds``;
    otherwise exactly ``max_rounds`` rounds and one look. "faster"/"slower" need the
    ``confidence`` interval (shared by the looks) to clear ``1 +- tolerance``; "no significant
    difference" needs it inside ``1 +- equivalence``; anything else is "undecided", with the
    rounds it would take. A time budget never shortens the rounds a verdict needs: it leaves
    the arm undecided. ``clock`` replaces ``time.perf_counter`` (tests); on CUDA, step times
    come from CUDA events.
    ``progress``: a bar over the measuring rounds (``True``), none (``False``), or a callback
    that gets a ``gpudiag._progress.Progress`` per round and ``finished`` when every arm has
    its verdict (possibly well before the round limit).

    ``nproc=N`` runs the trial as N ranks through torchrun instead (DDP baseline vs
    ``fsdp.wrap``; the keyword arguments of gpudiag.experiment.distributed.compare_distributed,
    e.g. ``ddp=``, ``accumulation=``, ``workload_args=``, ``rounds=``, apply).
    """
    check_compare(locals())  # the protocol's numbers, before anything runs
    if nproc is not None:  # N ranks through torchrun: gpudiag.experiment.distributed
        distributed.setdefault("progress", progress)
        return _hand_off(workload, fixes, nproc, seed, confidence, tolerance, distributed)
    if distributed:
        raise GpuDiagError(f"unknown argument(s) {', '.join(sorted(distributed))} of compare")
    started = time.perf_counter()
    wall = clock or time.perf_counter
    if not isinstance(workload, Workload):
        raise GpuDiagError(
            f"compare needs a gd.Workload, got {type(workload).__name__}: wrap a model with "
            "gd.Workload(model, batch=..., loss=...) or a step with gd.Workload.from_step(fn)"
        )
    if system is None:
        system = fix_system.current_system()
    device_type = (
        workload.device_type if workload.model is not None else fix_system.device_type_for(system)
    )
    hardware, system_facts = _hardware(system, device_type)

    arm_fixes, skipped = _prepare_arms(fixes, combine, workload, system, device_type)
    rule = AdaptiveRule(
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        time_budget_s=time_budget_s if adaptive else math.inf,
        confidence=confidence,
        tolerance=tolerance,
        equivalence=equivalence,
        adaptive=adaptive,
    )
    notes: list[str] = []
    shared, isolation = _sharing(copies, workload, system, device_type, len(arm_fixes) + 1, notes)

    on_progress = resolve(progress)
    with isolated(*workload.protected) as snapshot:
        arms = _build_arms(workload, arm_fixes, shared, device_type, system, notes)
        try:
            for arm in arms:
                arm.open(refusal_is_not_applied=True)
            reference = snapshot.named_values(workload.model) if workload.model is not None else {}
            # Before the rounds: drift check, peak memory, warm-up (a minute on a slow step).
            report(on_progress, "compare: preparing", 0, 3, "drift check")
            traces = _drift_phase(
                arms, workload, snapshot, reference, shared, drift_steps, seed, wall
            )
            report(on_progress, "compare: preparing", 1, 3, "peak memory")
            memory = _memory_phase(arms, device_type) if measure_memory else {}
            report(on_progress, "compare: preparing", 2, 3, "warm-up")
            _warmup_phase(arms, warmup_steps, clock)
            _proof_phase(arms)
            k = _steps_per_sample(arms, min_sample_s, steps_per_sample)
            compiled_before = {a.label: a.dynamo["frames"] for a in arms}
            before = contention.snapshot()
            rounds, stops, looks, measuring_s = _timing_phase(
                arms, rule, adaptive, k, seed, on_progress, clock, wall
            )
            # Real timings only: an injected clock's times do not depend on the machine.
            load = contention.between(before, contention.snapshot()) if clock is None else None
            _recompile_notes(arms, compiled_before)
        finally:
            for arm in arms:
                arm.close()

    results = _verdict_phase(arms, traces, memory, stops, looks, workload)
    # After the evidence: a busy machine allows no "no significant difference" (busy.py).
    results = [_on_this_machine(r, load) for r in results]
    overall = _overall_stop(stops, adaptive, rounds, rule)
    notes += list(
        dict.fromkeys(
            f.spec.first_steps_note for a in arms for f in a.fixes if f.spec.first_steps_note
        )
    )
    comparison = Comparison(
        workload=workload.name,
        workload_description=workload.describe(),
        device=str(workload.device) if workload.model is not None else device_type,
        hardware=hardware,
        baseline=results[0],
        arms=tuple(results[1:]),
        skipped=tuple(skipped),
        rounds=rounds,
        steps_per_sample=k,
        adaptive=adaptive,
        stop_reason=overall,
        elapsed_s=time.perf_counter() - started,
        measuring_s=measuring_s,
        confidence=confidence,
        tolerance=tolerance,
        isolation=isolation,
        notes=tuple(notes),
        created_at=_dt.datetime.now().isoformat(timespec="seconds"),
        system=system_facts,
        verdict_rule=rule.plan.describe(),
        machine_load=load,
    )
    _remember(workload, comparison)
    return comparison


def _remember(workload: Workload, comparison: Comparison) -> None:
    """Keep each arm's verdict for this process (gpudiag._measured): advice about a fix on
    this workload reads the trial rather than a micro-benchmark's prediction."""
    subject = workload.model if workload.model is not None else workload.step_fn
    for arm in comparison.arms:
        if arm.verdict is None or arm.speedup is None:
            continue
        trial = _measured.MeasuredTrial(
            comparison.workload_description,
            arm.label,
            tuple(f.id for f in arm.fixes),
            arm.verdict,
            str(arm.speedup),
            comparison.rounds,
            comparison.created_at,
        )
        _measured.record_trial(subject, trial)


# -- the protocol's phases, in the order compare() runs them -------------------------------


def _hand_off(
    workload: Any,
    fixes: Iterable[ArmSpec],
    nproc: int,
    seed: int,
    confidence: float,
    tolerance: float,
    distributed: dict[str, Any],
) -> Comparison:
    """``nproc=N``: the trial runs as N ranks through torchrun (experiment.distributed)."""
    import inspect

    from gpudiag.experiment.distributed import compare_distributed

    unknown = sorted(set(distributed) - set(inspect.signature(compare_distributed).parameters))
    if unknown:
        raise GpuDiagError(f"unknown argument(s) {', '.join(unknown)} of compare(nproc=...)")

    return compare_distributed(
        workload, fixes, nproc=nproc, seed=seed, confidence=confidence,
        tolerance=tolerance, **distributed,
    )  # fmt: skip


def _prepare_arms(
    fixes: Iterable[ArmSpec],
    combine: bool,
    workload: Workload,
    system: SystemReport | None,
    device_type: str,
) -> tuple[list[tuple[Fix, ...]], list[tuple[str, str]]]:
    """The arms to measure (fix tuples, deduplicated, conflicts refused) and the skipped
    ones with the reason; with ``combine``, one more arm with every fix that can run."""
    wanted = [_arm_fixes(spec) for spec in fixes]
    skipped: list[tuple[str, str]] = []
    arm_fixes: list[tuple[Fix, ...]] = []
    for combo in wanted:
        label = "+".join(f.label for f in combo)
        if combo in arm_fixes or any(label == s for s, _ in skipped):
            continue
        check_conflicts(combo)
        reason = _why_not(combo, workload, system, device_type)
        if reason:
            skipped.append((label, reason))
        else:
            arm_fixes.append(combo)
    if combine and len(arm_fixes) > 1:
        # The combination of what this machine can take; skipped fixes are already reported.
        together = tuple(dict.fromkeys(f for combo in arm_fixes for f in combo))
        check_conflicts(together)
        arm_fixes.append(together)
    return arm_fixes, skipped


def _sharing(
    copies: bool | None,
    workload: Workload,
    system: SystemReport | None,
    device_type: str,
    n_arms: int,
    notes: list[str],
) -> tuple[bool, str]:
    """Whether the arms share the user's model (else each gets a deep copy), and the text
    that says so."""
    shared = not workload.owns_step
    if workload.owns_step:
        shared = not _use_copies(copies, workload, system, device_type, n_arms, notes)
    isolation = (
        "each arm on its own deep copy; the user's model snapshot, restored and verified"
        if not shared
        else "arms on the user's objects, snapshot, restored and verified after the comparison"
    )
    return shared, isolation


def _why_not(
    combo: tuple[Fix, ...], workload: Workload, system: SystemReport | None, device_type: str
) -> str:
    for fix in combo:
        missing = fix.missing()
        if missing:  # the user's to give: measuring it would compare the baseline with itself
            raise FixError(missing)
        blocker = fix.live_blocker() or fix.unmet_needs(workload)
        if blocker:
            return blocker
        ok, reason = fix.supported(system, device_type)
        if not ok:
            return reason
    return ""


def _use_copies(
    copies: bool | None,
    workload: Workload,
    system: SystemReport | None,
    device_type: str,
    n_arms: int,
    notes: list[str],
) -> bool:
    if copies is not None:
        return copies
    # Parameters, gradients and two Adam moments: about 4x the model per arm.
    need = 4 * tensor_bytes(workload.model) * n_arms
    available = _available_bytes(system, device_type)
    if available is not None and need > available // 2:
        notes.append(
            f"arms share the user's model (copies would need ~{need / 2**30:.1f} GiB of "
            f"{available / 2**30:.1f} GiB free); it is restored afterwards"
        )
        return False
    return True


def _build_arms(
    workload: Workload,
    arm_fixes: list[tuple[Fix, ...]],
    shared: bool,
    device_type: str,
    system: SystemReport | None,
    notes: list[str],
) -> list[Arm]:
    arms = []
    limit = StepLimit.of(workload)  # one for all arms: later steps are limited from the first
    for combo in [(), *arm_fixes]:
        label = "+".join(f.label for f in combo) or "baseline"
        model = workload.model
        if not shared:
            try:
                model = copy.deepcopy(workload.model)
            except Exception as exc:  # some modules (open files, locks) cannot be copied
                notes.append(f"deep copy failed ({exc}); arms share the user's model")
                return _build_arms(workload, arm_fixes, True, device_type, system, notes)
        arms.append(Arm(label, combo, workload, model, shared, device_type, system, limit=limit))
    return arms


def _drift_phase(
    arms: list[Arm],
    workload: Workload,
    snapshot: Any,
    reference: dict[str, Any],
    shared: bool,
    steps: int,
    seed: int,
    clock: Callable[[], float],
) -> dict[str, StepTrace]:
    """Each arm from the same state and seeds; the baseline twice (nondeterminism floor)."""
    traces: dict[str, StepTrace] = {}
    order = [arms[0], arms[0], *arms[1:]] if steps > 0 else []
    for i, arm in enumerate(order):
        key = "baseline (repeat)" if i == 1 else arm.label
        if shared:
            snapshot.restore()
        elif reference:
            load_values(arm.base_model, reference)
        if arm.base_model is not None:
            # Pending gradients of the user's model would add into the first step's.
            arm.base_model.zero_grad(set_to_none=True)
        seed_everything(seed)
        arm.reset_batches()
        arm.new_optimizer()
        if not arm.runs:
            continue
        try:
            traces[key] = arm.trace(steps, clock)
        except Exception as exc:
            arm.error = _error_text(exc)
        if arms[0].error is not None:
            break  # no comparison without a baseline: the warm-up phase says why
    if shared:
        snapshot.restore()
    for arm in arms:
        if steps <= 0:
            arm.new_optimizer()
    return traces


def _error_text(exc: BaseException) -> str:
    if cuda.is_oom_error(exc):
        return f"out of memory: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _drift_for(traces: dict[str, StepTrace], arm: Arm, baseline: Arm) -> Drift:
    if arm.label not in traces and arm.not_applied:
        return not_measured("the fix did not take effect: the arm was not run")
    if arm.label not in traces or baseline.label not in traces:
        return not_measured(
            "no drift steps were run" if not traces else "the arm failed before the drift check"
        )
    if arm.workload.step_fn is not None and arm.workload.model is None:
        drift = compare_traces(
            traces[baseline.label], traces[arm.label], traces.get("baseline (repeat)")
        )
        if drift.status != "not measured":
            return dataclasses.replace(
                drift, note="step function without a model: its state was not reset between arms"
            )
        return drift
    return compare_traces(
        traces[baseline.label], traces[arm.label], traces.get("baseline (repeat)")
    )


def _memory_phase(arms: list[Arm], device_type: str) -> dict[str, PeakMemory]:
    out = {}
    for arm in arms:
        if not arm.runs or arms[0].error is not None:
            continue
        try:
            with arm.active():
                out[arm.label] = measure_peak_memory(arm.step, device_type=device_type)
        except Exception as exc:
            arm.error = _error_text(exc)
    return out


def _warmup_phase(arms: list[Arm], warmup_steps: int, clock: Callable[[], float] | None) -> None:
    """At least one timed step per arm (allocator, autotuning, lazy init); a failing arm keeps
    its error, a failing baseline ends the comparison."""
    for arm in arms:
        if not arm.runs or arms[0].error is not None:
            continue
        try:
            for _ in range(max(1, warmup_steps)):
                arm.warmup_s.append(arm.timed(1, clock))
        except Exception as exc:
            arm.error = _error_text(exc)
    if arms[0].error is not None:
        raise GpuDiagError(f"the baseline itself failed: {arms[0].error}")


def _proof_phase(arms: list[Arm]) -> None:
    """One untimed, warm step of each arm, observed: each fix proves it took effect against
    the baseline's step (FixSpec.proof). An arm with a fix that did not is not timed. The
    observed step runs under the step limit (Arm.step) like every other; a baseline whose
    step hangs or exits there ends the comparison, as in the phases before."""
    baseline = None
    try:
        baseline = arms[0].prove(None)
    except (StepTimeoutError, StepExitError) as exc:
        arms[0].error = _error_text(exc)
        raise GpuDiagError(f"the baseline itself failed: {arms[0].error}") from exc
    except Exception as exc:  # the arms are still proven, without a baseline to compare to
        arms[0].notes.append(f"the baseline's step could not be observed: {_error_text(exc)}")
    for arm in arms[1:]:
        if not arm.runs:
            continue
        try:
            arm.prove(baseline)
        except Exception as exc:
            arm.error = _error_text(exc)


def _recompile_notes(arms: list[Arm], before: dict[str, int]) -> None:
    for arm in arms:
        again = arm.dynamo["frames"] - before.get(arm.label, 0)
        if again > 0:
            arm.notes.append(
                f"torch.compile compiled {again} frame(s) again during the timed rounds "
                "(recompilation): their time is in the samples"
            )


def _steps_per_sample(arms: list[Arm], min_sample_s: float, steps_per_sample: int | None) -> int:
    """Steps in one timed sample: enough that the fastest warm-up step lasts ``min_sample_s``."""
    if steps_per_sample is None:
        fastest = min(min(a.warmup_s) for a in arms if a.warmup_s and not a.not_applied)
        return max(1, math.ceil(min_sample_s / fastest)) if fastest > 0 else 1
    return max(1, int(steps_per_sample))


def _timing_phase(
    arms: list[Arm],
    rule: AdaptiveRule,
    adaptive: bool,
    k: int,
    seed: int,
    on_progress: ProgressFn | None,
    clock: Callable[[], float] | None,
    wall: Callable[[], float],
) -> tuple[int, dict[str, str], dict[str, Judgement], float]:
    """Rounds of ``k`` steps per arm in a fresh random order; with ``adaptive``, each arm
    stops when its AdaptiveStopper says so. (rounds, stop reason per arm, the verdict's look
    per arm, seconds). Arms whose fix did not take effect are not timed."""
    rng = random.Random(seed)
    stoppers = {a.label: AdaptiveStopper(rule) for a in arms[1:]}
    stops: dict[str, str] = {a.label: "not applied" for a in arms[1:] if a.not_applied}
    looks: dict[str, Judgement] = {}
    active = [a for a in arms[1:] if a.error is None and not a.not_applied]
    rounds = 0
    t0 = wall()
    with closed_on_error(on_progress):
        report(on_progress, "compare", 0, rule.max_rounds)
        while active and rounds < rule.max_rounds:
            order = [arms[0], *active]
            rng.shuffle(order)
            for arm in order:
                try:
                    arm.samples_s.append(arm.timed(k, clock))
                except Exception as exc:
                    if arm is arms[0]:
                        raise GpuDiagError(
                            f"the baseline failed while measuring: {_error_text(exc)}"
                        ) from exc
                    arm.error = _error_text(exc)
            rounds += 1
            elapsed = wall() - t0
            still = []
            for arm in active:
                if arm.error is not None:
                    continue
                n = len(arm.samples_s)
                if adaptive:
                    decision = stoppers[arm.label].update(
                        arms[0].samples_s[:n],
                        per_baseline_step(arm, arms[0]),
                        rounds=n,
                        elapsed_s=elapsed,
                        round_s=elapsed / rounds,
                    )
                    if decision.stop:
                        stops[arm.label] = decision.reason
                        if decision.judgement is not None:
                            looks[arm.label] = decision.judgement
                        continue
                still.append(arm)
            active = still
            shown = {a.label: _last_look(stoppers[a.label]) for a in active}
            note = ", ".join(f"{k}: {v}" for k, v in shown.items())
            report(on_progress, "compare", rounds, rule.max_rounds, note)
        # Every arm has its verdict (often before the round limit): the wait is over.
        finish(on_progress, "compare")
    elapsed = wall() - t0
    for arm in active:
        stops.setdefault(arm.label, "max rounds" if adaptive else "fixed")
        looks[arm.label] = judge(
            arms[0].samples_s[: len(arm.samples_s)],
            per_baseline_step(arm, arms[0]),
            rule.plan,
            final=True,
            round_s=elapsed / rounds if rounds else None,
        )
    return rounds, stops, looks, elapsed


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


def _verdict_phase(
    arms: list[Arm],
    traces: dict[str, StepTrace],
    memory: dict[str, PeakMemory],
    stops: dict[str, str],
    looks: dict[str, Judgement],
    workload: Workload,
) -> list[ArmResult]:
    """Each arm's result: speed-up against the baseline with its verdict (from its last look),
    proofs, drift, memory."""
    baseline_arm = arms[0]
    results = []
    for arm in arms:
        look = looks.get(arm.label)
        est: SpeedupEstimate | None = None
        verdict_text: str | None = None
        if not arm.is_baseline and arm.error is None:
            if arm.not_applied:
                verdict_text = NOT_APPLIED
            elif look is not None:
                est, verdict_text = look.estimate, look.verdict
        drift = None
        if not arm.is_baseline:
            drift = _drift_for(traces, arm, baseline_arm)
            if arm.samples_per_step != baseline_arm.samples_per_step and arm.samples_per_step:
                drift = not_measured(
                    f"the arm takes {arm.samples_per_step} samples per optimizer step, the "
                    f"baseline {baseline_arm.samples_per_step}: their losses are not comparable"
                )
        stop = stops.get(arm.label)
        results.append(
            ArmResult(
                label=arm.label,
                fixes=arm.fixes,
                step_time=Measurement(tuple(arm.samples_s), arm.label),
                samples_per_step=arm.samples_per_step,
                tokens_per_sample=workload.tokens_per_sample,
                memory=memory.get(arm.label),
                drift=drift,
                speedup=est,
                verdict=verdict_text,
                stop_reason=describe_stop(stop) if stop else ("" if arm.is_baseline else "fixed"),
                first_step_s=arm.first_step_s,
                error=arm.error,
                notes=tuple(arm.notes),
                proofs=arm.proofs,
                judgement=None if verdict_text == NOT_APPLIED else look,
            )
        )
    return results


def _on_this_machine(result: ArmResult, load: MachineLoad | None) -> ArmResult:
    """The verdict the machine's load allows (gpudiag.experiment.busy), applied after the
    evidence (``judge``): an arm judged "no significant difference" on a busy machine becomes
    "undecided", its judgement saying what it needs (a quieter machine), the reason also in
    its notes; faster / slower stand (the comparison warns that the machine was busy)."""
    judged, why = verdict_on(load, result.verdict)
    if not why:
        return result
    judgement = result.judgement or Judgement(
        UNDECIDED, result.speedup, len(result.step_time.samples_s), why
    )
    judgement = dataclasses.replace(
        judgement, verdict=UNDECIDED, reason=why, more_rounds=None, more_s=None
    )
    return dataclasses.replace(
        result, verdict=judged, judgement=judgement, notes=(*result.notes, why)
    )


def per_baseline_step(arm: Arm, baseline: Arm) -> list[float]:
    """The arm's step times scaled to the baseline's samples per step, so that ratios with the
    baseline's step times are ratios of samples/s (the same numbers unless a batch fix
    changed the samples per step)."""
    if not arm.samples_per_step or not baseline.samples_per_step:
        return list(arm.samples_s)  # a step function of unknown batch: step times as they are
    scale = baseline.samples_per_step / arm.samples_per_step
    return [t * scale for t in arm.samples_s]


def _last_look(stopper: AdaptiveStopper) -> str:
    return stopper.history[-1].verdict if stopper.history else "..."


def _overall_stop(stops: dict[str, str], adaptive: bool, rounds: int, rule: AdaptiveRule) -> str:
    if not adaptive:
        return f"fixed protocol: {rounds} rounds"
    if not stops:
        return "nothing to compare"
    reasons = sorted(set(stops.values()))
    return "; ".join(
        f"{describe_stop(r)} ({', '.join(label for label, s in stops.items() if s == r)})"
        for r in reasons
    )


__all__ = ["NO_DIFFERENCE", "ArmResult", "Comparison", "compare"]
