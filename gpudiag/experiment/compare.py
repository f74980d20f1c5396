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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gpudiag import _measured
from gpudiag._progress import ProgressFn, closed_on_error, finish, report, resolve
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
from gpudiag.experiment.comparison import ArmResult, ArmSpec, Comparison, fixes_of
from gpudiag.experiment.drift import Drift, StepTrace, compare_traces, not_measured
from gpudiag.experiment.memory import PeakMemory, measure_peak_memory
from gpudiag.experiment.runner import Arm, load_values, seed_everything
from gpudiag.experiment.step_limit import StepLimit
from gpudiag.experiment.trial import isolated, tensor_bytes
from gpudiag.fixes import Fix, check_conflicts
from gpudiag.fixes import _system as fix_system
from gpudiag.probe import contention, cuda
from gpudiag.step import Workload

if TYPE_CHECKING:
    from gpudiag.probe.contention import MachineLoad
    from gpudiag.probe.system import SystemReport


def _hardware(system: SystemReport | None, device_type: str) -> tuple[str, dict[str, Any]]:
    host = fix_system.host(system)
    version = host.torch.version.get("?") if host is not None else "?"
    facts: dict[str, Any] = {"torch": version, "device_type": device_type}
    if device_type == "cuda":
        cc, name = fix_system.gpu_cc(system)
        facts.update(gpu=name, compute_capability=fix_system.cc_text(cc))
        return f"GPU {name} (compute capability {fix_system.cc_text(cc)}), torch {version}", facts
    cpu = host.cpu_model.get("unknown CPU") if host is not None else "unknown CPU"
    cores = host.logical_cores.get("?") if host is not None else "?"
    instructions = host is not None and host.cpu_bf16_instructions
    bf16 = " with bf16 instructions" if instructions else ""
    facts.update(cpu=cpu, logical_cores=cores, cpu_bf16_instructions=instructions)
    return f"CPU {cpu} ({cores} logical cores{bf16}), torch {version}", facts


def _available_bytes(system: SystemReport | None, device_type: str) -> int | None:
    if device_type == "cuda":
        info = cuda.mem_get_info()
        return None if info is None else info[0]
    host = fix_system.host(system)
    return host.memory_available_bytes.get() if host is not None else None


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

    ``gd.compare`` (gpudiag.trials) is this protocol in one process, or with ``nproc=N`` the
    multi-rank trial of gpudiag.distributed.compare.
    """
    check_compare(locals())  # the protocol's numbers, before anything runs
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


def _prepare_arms(
    fixes: Iterable[ArmSpec],
    combine: bool,
    workload: Workload,
    system: SystemReport | None,
    device_type: str,
) -> tuple[list[tuple[Fix, ...]], list[tuple[str, str]]]:
    """The arms to measure (fix tuples, deduplicated, conflicts refused) and the skipped
    ones with the reason; with ``combine``, one more arm with every fix that can run."""
    wanted = [fixes_of(spec) for spec in fixes]
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
