"""``gd.tune``: from a diagnosis to the best measured set of fixes, within a time budget.

The search, each step measured with ``gd.compare`` (so every arm's fixes prove they took
effect, drift is checked, the machine's load is read, the user's state is restored):

1. **Diagnose** the workload (``gd.diagnose``) and list the candidates: the fixes its findings
   recommend and those the workload's structure calls for, with the parameter values worth
   trying (gpudiag.tune.candidates).
2. **Race** the candidates, with an A/A control arm (``control.none``), in one comparison whose
   arms stop at the first planned look that decides them. Dropped, with the reason: not applied,
   failed, slower, no significant difference, drift beyond its threshold, over the memory
   budget, a better value of the same fix, below the top ``KEEP`` (successive halving).
   Undecided arms whose estimate is above 1 get one more race with twice the rounds.
3. **Combine** the winners greedily: the incumbent (best so far) against incumbent + each
   winner that does not conflict with it (``check_conflicts``: fix groups and
   ``FixSpec.conflicts_with``), measured as combinations in one comparison, never multiplied.
   A combination is accepted when it is faster than the baseline and, in the same rounds,
   faster than the incumbent (``judge`` on the paired rounds).
4. **Re-diagnose** the best arm's step (``gd.diagnose`` on it) for the next bottleneck; fixes it
   recommends that were not tried are combined with the best in turn.

Error control: stage ``k``'s tests share ``alpha / 2**k`` (``alpha = 1 - confidence``), half
for the comparison's verdicts against the baseline, half (Bonferroni over the challengers) for
the combinations against the incumbent; every step on the path to ``best`` was decided in its
stage, so the chance that any of them is a false "faster" is at most ``alpha``.

The budget: each stage starts only when what it needs at the least (the overheads the last
comparison showed per arm, and its first planned look) fits what is left; what is left undone
is said (``not_reached``) and a later ``gd.tune(..., resume=result)`` continues from there.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpudiag._progress import ProgressFn, resolve
from gpudiag.analysis.verdict import FASTER, NOT_APPLIED, UNDECIDED, VerdictPlan, judge
from gpudiag.errors import ArgumentError, FixConflictError, GpuDiagError
from gpudiag.experiment.comparison import ArmResult, Comparison
from gpudiag.fixes import Fix, check_conflicts
from gpudiag.fixes import _system as fix_system
from gpudiag.step import Workload
from gpudiag.trials import compare
from gpudiag.tune.candidates import Candidate, from_evidence
from gpudiag.tune.result import (
    ACCEPTED,
    BEST,
    CONTROL,
    DROPPED,
    MULTI_RANK,
    RERACED,
    WINNER,
    SearchState,
    Stage,
    TunedArm,
    TuneResult,
)

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport
    from gpudiag.rules.engine import Diagnosis

CONTROL_ID = "control.none"
KEEP = 4  # winners kept after a race (successive halving keeps the better ones)
CHALLENGERS = 3  # combinations measured per combination stage
RACE_ROUNDS = 40  # round limit of a race (its arms usually stop at an earlier look)
COMBINE_ROUNDS = 24  # round limit of a combination stage
RACE_SHARE = 0.5  # of the time left, what a race's timed rounds may take (the rest: combining)
DRIFT_BAD = ("large", "non-finite")
OVERRUN = 0.10  # the search ends within its budget + this share
OBJECTIVES = ("throughput",)


def tune(
    workload: Workload | str,
    *,
    time_budget_s: float = 600.0,
    memory_budget: int | str | None = None,
    fixes: Sequence[Fix | str] | None = None,
    objective: str = "throughput",
    progress: bool | ProgressFn = True,
    resume: TuneResult | None = None,
    diagnosis: Diagnosis | bool = True,
    confidence: float = 0.95,
    system: SystemReport | None = None,
    seed: int = 0,
    clock: Callable[[], float] | None = None,
    nproc: int | None = None,
    **protocol: Any,
) -> TuneResult:
    """Search the fixes the evidence points to for the fastest measured combination.

    ``workload``: a ``gd.Workload`` or a demo name. ``time_budget_s``: the whole search
    (diagnosis included) ends within it + 10 %, saying what it did not reach. ``memory_budget``
    (bytes or "8GiB"): batch sizes over it by the memory estimate are not tried and an arm
    whose measured peak is over it is dropped. ``fixes``: the candidate set instead of the
    evidence's (an id without values, ``"batch.size"``, is expanded into the values worth
    trying). ``objective``: ``"throughput"`` (samples/s against the baseline's batch).
    ``resume``: a previous result of the same workload; the search continues where it stopped,
    with a new budget. ``diagnosis``: ``True`` runs ``gd.diagnose`` first, a ``Diagnosis`` is
    used as given, ``False`` skips it (candidates from the workload and ``fixes`` only).
    ``confidence``: of the whole path to ``best`` (see the module's error control).
    ``protocol``: options passed to every ``gd.compare`` (``min_sample_s``,
    ``steps_per_sample``, ``measure_memory``, ``drift_steps``, ``warmup_steps``).
    The user's model, optimizer, RNG and torch switches are restored by every comparison and
    diagnosis the search runs, also on an error or Ctrl-C.
    """
    if objective not in OBJECTIVES:
        raise ArgumentError(
            f"objective {objective!r} is not supported: tune measures {', '.join(OBJECTIVES)}"
        )
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2):
        raise ArgumentError(f"nproc must be a whole number of ranks, 2 or more; got {nproc!r}")
    if not (isinstance(time_budget_s, (int, float)) and math.isfinite(time_budget_s)) or (
        time_budget_s <= 0
    ):
        raise ArgumentError(
            f"time_budget_s must be a positive number of seconds, got {time_budget_s!r}"
        )
    if not 0.5 <= confidence < 1:
        raise ArgumentError(f"confidence must be in [0.5, 1), got {confidence!r}")
    unknown = sorted(set(protocol) - _PROTOCOL)
    if unknown:
        raise ArgumentError(
            f"unknown argument(s) {', '.join(unknown)} of tune; it passes "
            f"{', '.join(sorted(_PROTOCOL))} to gd.compare"
        )
    if isinstance(workload, str):
        from gpudiag.workloads import get

        workload = get(workload)
    if not isinstance(workload, Workload):
        raise GpuDiagError(
            f"tune needs a gd.Workload or a demo name, got {type(workload).__name__}"
        )
    if resume is not None and not isinstance(resume, TuneResult):
        raise ArgumentError(f"resume takes a previous gd.tune result, got {type(resume).__name__}")
    if resume is not None and resume.workload != workload.name:
        raise ArgumentError(
            f"resume is a search of workload {resume.workload!r}, not {workload.name!r}"
        )
    from gpudiag.experiment.memory_report import parse_budget

    search = _Search(
        workload,
        budget_s=float(time_budget_s),
        memory_budget=parse_budget(memory_budget),
        fixes=fixes,
        progress=resolve(progress),
        confidence=confidence,
        system=system if system is not None else fix_system.current_system(),
        seed=seed,
        clock=clock,
        protocol=protocol,
        resume=resume,
        nproc=nproc,
    )
    return search.run(diagnosis)


_PROTOCOL = frozenset(
    {"min_sample_s", "steps_per_sample", "measure_memory", "drift_steps", "warmup_steps",
     "tolerance", "equivalence", "copies"}
)  # fmt: skip


class _Search:
    def __init__(
        self,
        workload: Workload,
        *,
        budget_s: float,
        memory_budget: int | None,
        fixes: Sequence[Fix | str] | None,
        progress: ProgressFn | None,
        confidence: float,
        system: SystemReport | None,
        seed: int,
        clock: Callable[[], float] | None,
        protocol: dict[str, Any],
        resume: TuneResult | None,
        nproc: int | None = None,
    ) -> None:
        self.workload = workload
        self.nproc = nproc
        self.budget_s = budget_s
        self.memory_budget = memory_budget
        self.fixes = fixes
        self.progress = progress
        self.alpha = 1.0 - confidence
        self.confidence = confidence
        self.system = system
        self.seed = seed
        self.clock = clock
        self.wall = clock or time.perf_counter
        self.protocol = protocol
        self.tolerance = float(protocol.get("tolerance", 0.01))
        self.device_type = (
            workload.device_type
            if workload.model is not None
            else fix_system.device_type_for(system)
        )
        self.started = self.wall()
        self.deadline = self.started + budget_s
        self.history: list[TunedArm] = []
        self.stages: list[Stage] = []
        self.skipped: list[tuple[str, str]] = []
        self.candidates: list[Candidate] = []
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.next_bottleneck: tuple[str, ...] = ()
        self.diagnosis: Diagnosis | None = None
        self.stopped: list[str] = []  # why the search left things untried
        # Seconds per arm a comparison spends outside its timed rounds (drift, memory,
        # warm-up, proof, compilation), learned from the last one; a guess until then.
        self.overhead_per_arm: float | None = None
        self.round_s_per_arm: float | None = None
        self.slow_first_s = 0.0
        self.state = SearchState()
        if resume is not None:
            self._resume(resume)

    # -- the loop ---------------------------------------------------------------------------
    def run(self, diagnosis: Diagnosis | bool) -> TuneResult:
        from gpudiag.fixes.control import NoChange
        from gpudiag.fixes.spec import registered

        with _registered_control(registered, NoChange):
            if not self.state.stages and not self.state.pending and not self.history:
                self._diagnose_stage(diagnosis)
            while not self.state.done:
                if not self._next_stage():
                    break
        return self._result()

    def _next_stage(self) -> bool:
        """Run the next stage if the budget allows it; False when it does not."""
        st = self.state
        if st.pending and not st.tests:
            return self._race(st.pending, rounds=RACE_ROUNDS, rerace=False)
        if st.remaining and st.incumbent is not None:
            return self._combine()
        # The next bottleneck of the best arm before more rounds for undecided ones: what it
        # recommends is combined with the best, which a re-raced single fix would only reach
        # a stage later.
        if st.incumbent is not None and st.rediagnosed != st.incumbent.label:
            return self._rediagnose()
        if st.promising and not st.reraced:
            picked = self._halve(st.promising)
            return self._race(picked, rounds=2 * RACE_ROUNDS, rerace=True) if picked else True
        if st.pending:  # candidates a first race had no room for
            return self._race(st.pending, rounds=RACE_ROUNDS, rerace=False)
        if st.multi_rank:
            return self._multi_rank()
        st.remaining.clear()
        return False

    # -- budget -----------------------------------------------------------------------------
    def _left(self) -> float:
        return self.deadline - self.wall()

    def _fits(self, arms: Sequence[Sequence[Fix]], looks_at: int, what: str) -> float | None:
        """Seconds for the timed rounds of a comparison of ``arms`` (the baseline besides),
        or None (and ``what`` noted as not reached) when its overheads (per arm, and the first
        step of each arm that compiles or captures) and its first look would not fit what is
        left of the budget (+ OVERRUN)."""
        n = len(arms) + 1
        left = self._left() + OVERRUN * self.budget_s * 0.5
        slow = sum(1 for a in arms if any(f.spec.slow_first_step for f in a))
        overhead = (self.overhead_per_arm or 0.0) * n + self.slow_first_s * slow
        rounds_s = (self.round_s_per_arm or 0.0) * n * looks_at
        if overhead + rounds_s > left:
            need = overhead + rounds_s
            self.stopped.append(
                f"the budget ran out before: {what} (would need ~{need:.0f} s, "
                f"{max(0, left):.0f} s left)"
            )
            return None
        return max(0.5, self._left() - overhead)

    def _learn(self, c: Comparison, took_s: float) -> None:
        """Overheads per arm, the first step of an arm that compiles or captures, and seconds
        per arm-round, from a comparison that took ``took_s`` on the search's clock."""
        n = len(c.arms) + 1
        firsts = [
            a.first_step_s or 0.0
            for a in c.arms
            if any(f.spec.slow_first_step for f in a.fixes) and a.error is None
        ]
        if firsts:
            self.slow_first_s = max(firsts)
        self.overhead_per_arm = max(0.0, took_s - c.measuring_s - sum(firsts)) / n
        if c.rounds:
            self.round_s_per_arm = c.measuring_s / c.rounds / n

    def _stage_alpha(self) -> float:
        """The error this stage's tests may spend: alpha/2^k for the k-th measuring stage
        (its tests counted once it runs: ``SearchState.tests``)."""
        return self.alpha / 2 ** (self.state.tests + 1)

    # -- stages -----------------------------------------------------------------------------
    def _diagnose_stage(self, diagnosis: Diagnosis | bool) -> None:
        t0 = self.wall()
        if diagnosis is True:
            from gpudiag.doctor import diagnose

            self.diagnosis = diagnose(
                self.workload, system=self.system, progress=self.progress or False
            )
        elif diagnosis is not False:
            self.diagnosis = diagnosis
        timed = self.diagnosis.step_time if self.diagnosis is not None else None
        if timed is not None and timed.seconds:
            # Until a comparison says: about ten steps per arm outside the timed rounds (drift,
            # memory, warm-up, proof), and a round of at least one step per arm.
            self.overhead_per_arm = 10 * timed.seconds
            self.round_s_per_arm = max(
                float(self.protocol.get("min_sample_s", 0.05)), timed.seconds
            )
        self.candidates, skipped = from_evidence(
            self.workload,
            self.diagnosis,
            system=self.system,
            device_type=self.device_type,
            fixes=self.fixes,
            memory_budget=self.memory_budget,
            nproc=self.nproc,
        )
        self.skipped += skipped
        self.state.pending = [c for c in self.candidates if not c.fix.spec.multi_rank]
        self.state.multi_rank = [c for c in self.candidates if c.fix.spec.multi_rank]
        self.state.stages += 1
        found = "; ".join(f"{c.label} ({c.source})" for c in self.candidates) or "none"
        name = "diagnose" if self.diagnosis is not None else "candidates"
        self.stages.append(
            Stage(self.state.stages, name, self.wall() - t0, note=f"candidates: {found}")
        )
        if not self.candidates:
            self.notes.append(
                "no candidate fix: the diagnosis recommends none that can be tried live here"
            )

    def _compare(self, arms: list[Any], alpha: float, rounds: int, budget_s: float) -> Comparison:
        options = dict(self.protocol)
        conf = 1.0 - alpha
        min_rounds = max(5, _fewest(conf))
        return compare(
            self.workload,
            arms,
            system=self.system,
            time_budget_s=budget_s,
            min_rounds=min_rounds,
            max_rounds=max(min_rounds, rounds),
            confidence=conf,
            seed=self.seed + self.state.stages,
            progress=self.progress or False,
            clock=self.clock,
            **options,
        )

    def _race(self, cands: list[Candidate], *, rounds: int, rerace: bool) -> bool:
        st = self.state
        name = "race again" if rerace else "race"
        control = [] if rerace else [Fix(CONTROL_ID)]
        alpha = self._stage_alpha()
        first = _first_look(1.0 - alpha, rounds)
        # As many candidates as the budget lets reach a first look, in their order (the
        # diagnosis' first); the others wait (not reached, or a resumed search).
        budget = None
        what = f"{name}: {', '.join(c.label for c in cands)}"
        for k in range(len(cands), 0, -1):
            arms = [[f] for f in control] + [[x.fix] for x in cands[:k]]
            budget = self._fits(arms, first, what)
            if budget is not None:
                break
        if budget is None:
            return False
        raced, waiting = cands[:k], cands[k:]
        if waiting:
            self.stopped.append(
                f"the budget left room to race {k} of {len(cands)} candidates; not raced: "
                + ", ".join(c.label for c in waiting)
            )
        t0 = self.wall()
        c = self._compare([*control, *(x.fix for x in raced)], alpha, rounds, budget * RACE_SHARE)
        st.tests += 1
        self._learn(c, self.wall() - t0)
        st.stages += 1
        index = st.stages
        if rerace:
            st.reraced = True
            st.promising = []
        else:
            st.pending = list(waiting)
        cands = raced
        winners: list[tuple[Candidate, ArmResult]] = []
        for label, why in c.skipped:
            self._drop_unmeasured(index, name, label, f"skipped: {why}")
        for cand in cands:
            st.tried.add(cand.fix)
            arm = _arm_of(c, (cand.fix,))
            if arm is None:
                continue
            why = self._why_dropped(c, arm)
            if why:
                self.history.append(self._arm(c, arm, index, name, DROPPED, why, cand.source))
            elif arm.verdict == FASTER:
                winners.append((cand, arm))
            elif arm.verdict == UNDECIDED and arm.speedup is not None and arm.speedup.value > 1:
                if rerace:
                    why = f"still undecided after more rounds ({arm.needs or 'no decision'})"
                    self.history.append(self._arm(c, arm, index, name, DROPPED, why, cand.source))
                else:
                    st.promising.append(cand)
                    st.race_speedup[cand.label] = _value(arm)
                    why = "undecided with an estimate above 1: raced again with more rounds"
                    self.history.append(self._arm(c, arm, index, name, RERACED, why, cand.source))
            else:
                why = f"undecided with an estimate at or below 1 ({arm.needs or arm.verdict})"
                self.history.append(self._arm(c, arm, index, name, DROPPED, why, cand.source))
        if control:
            self._control(c, index, name)
        self._keep_winners(c, winners, index, name)
        self.stages.append(
            Stage(index, name, self.wall() - t0, tuple(a.label for a in c.arms), 1 - alpha,
                  comparison=c)
        )  # fmt: skip
        return True

    def _halve(self, promising: list[Candidate]) -> list[Candidate]:
        """The undecided arms worth more rounds: not of a fix that already has a winning
        value, and the better half by their race estimate (successive halving)."""
        st = self.state
        won = {x.fix.spec.group or x.fix.id for x in st.remaining}
        if st.incumbent is not None:
            won |= {f.spec.group or f.id for f in st.incumbent.fixes}
        index, name = st.stages, "race"
        keep: list[Candidate] = []
        ranked = sorted(promising, key=lambda x: st.race_speedup.get(x.label, 0.0), reverse=True)
        for cand in ranked:
            group = cand.fix.spec.group or cand.fix.id
            if group in won:
                why = "undecided, and another value of the same fix was faster"
                self._drop_unmeasured(index, name, cand.label, why)
            elif any((k.fix.spec.group or k.fix.id) == group for k in keep):
                why = "undecided, and another value of the same fix had a higher estimate"
                self._drop_unmeasured(index, name, cand.label, why)
            else:
                keep.append(cand)
        # Successive halving, keeping at least two: with two fixes left, halving would drop
        # one on estimates the race could not decide.
        half = max(min(2, len(keep)), math.ceil(len(keep) / 2))
        for cand in keep[half:]:
            self._drop_unmeasured(
                index, name, cand.label, "undecided, in the lower half of the race's estimates"
            )
        st.promising = keep[:half]
        if not st.promising:
            st.reraced = True
        return st.promising

    def _keep_winners(
        self, c: Comparison, winners: list[tuple[Candidate, ArmResult]], index: int, name: str
    ) -> None:
        """Successive halving: the best value of each fix, then the best KEEP of those; the
        best becomes the incumbent when there is none yet."""
        st = self.state
        ranked = sorted(winners, key=lambda w: _value(w[1]), reverse=True)
        groups: dict[str, str] = {}
        kept: list[tuple[Candidate, ArmResult]] = []
        for cand, arm in ranked:
            group = cand.fix.spec.group or cand.fix.id
            if group in groups:
                why = f"a better value of the same fix was faster: {groups[group]}"
                self.history.append(self._arm(c, arm, index, name, DROPPED, why, cand.source))
                continue
            if len(kept) + len(st.remaining) >= KEEP:
                why = f"below the best {KEEP} of the race (successive halving)"
                self.history.append(self._arm(c, arm, index, name, DROPPED, why, cand.source))
                continue
            groups[group] = f"{arm.label} ({arm.speedup})"
            kept.append((cand, arm))
        for cand, arm in kept:
            st.race_speedup[cand.label] = _value(arm)
        if st.incumbent is None and kept:
            cand, arm = kept[0]
            st.incumbent = self._arm(c, arm, index, name, BEST, "fastest of the race", cand.source)
            st.incumbent_comparison = c
            self.history.append(st.incumbent)
            kept = kept[1:]
        for cand, arm in kept:
            self.history.append(
                self._arm(c, arm, index, name, WINNER, "faster than the baseline", cand.source)
            )
            st.remaining.append(cand)
        st.remaining.sort(key=lambda x: st.race_speedup.get(x.label, 0.0), reverse=True)

    def _combine(self) -> bool:
        st = self.state
        inc = st.incumbent
        assert inc is not None
        challengers: list[tuple[Candidate, tuple[Fix, ...]]] = []
        for cand in list(st.remaining):
            combo = (*inc.fixes, cand.fix)
            try:
                check_conflicts(combo)
            except FixConflictError as exc:
                st.remaining.remove(cand)
                self._drop_unmeasured(st.stages, "combine", "+".join(f.label for f in combo),
                                      f"not combined: {exc}")  # fmt: skip
                continue
            challengers.append((cand, combo))
            if len(challengers) == CHALLENGERS:
                break
        if not challengers:
            return True
        what = f"combine {inc.label} with {', '.join(c.label for c, _ in challengers)}"
        alpha = self._stage_alpha()
        first = _first_look(1.0 - alpha / 2, COMBINE_ROUNDS)
        budget = self._fits([inc.fixes, *(combo for _, combo in challengers)], first, what)
        if budget is None:
            return False
        t0 = self.wall()
        c = self._compare(
            [list(inc.fixes), *(list(combo) for _, combo in challengers)],
            alpha / 2,
            COMBINE_ROUNDS,
            budget * 0.7,
        )
        st.tests += 1
        self._learn(c, self.wall() - t0)
        st.stages += 1
        index, name = st.stages, "combine"
        inc_arm = _arm_of(c, inc.fixes)
        plan_conf = 1.0 - alpha / 2 / len(challengers)
        accepted: list[tuple[Candidate, ArmResult, Any]] = []
        for cand, combo in challengers:
            st.remaining.remove(cand)
            arm = _arm_of(c, combo)
            if arm is None:
                continue
            why = self._why_dropped(c, arm)
            if not why and arm.verdict != FASTER:
                why = f"{arm.verdict} against the baseline" + (
                    f" ({arm.needs})" if arm.needs else ""
                )
            versus = None
            if not why and inc_arm is not None:
                versus = _versus(c, inc_arm, arm, plan_conf, self.tolerance)
                if versus.verdict != FASTER:
                    why = f"not faster than {inc.label}: {versus}"
            elif not why:
                why = f"{inc.label} was not measured beside it"
            if why:
                self.history.append(
                    dataclasses.replace(
                        self._arm(c, arm, index, name, DROPPED, why, cand.source),
                        versus=versus,
                        grew_from=inc.label,
                    )
                )
            else:
                accepted.append((cand, arm, versus))
        if accepted:
            cand, arm, versus = max(accepted, key=lambda x: x[2].estimate.value)
            self._demote_incumbent()
            st.incumbent = dataclasses.replace(
                self._arm(c, arm, index, name, BEST, f"faster than {inc.label}", cand.source),
                versus=versus,
                grew_from=inc.label,
            )
            st.incumbent_comparison = c
            self.history.append(st.incumbent)
            for other, arm2, versus2 in accepted:
                if other is cand:
                    continue
                why = f"faster than {inc.label}, but {arm.label} was faster still"
                self.history.append(
                    dataclasses.replace(
                        self._arm(c, arm2, index, name, DROPPED, why, other.source),
                        versus=versus2,
                        grew_from=inc.label,
                    )
                )
        self.stages.append(
            Stage(index, name, self.wall() - t0, tuple(a.label for a in c.arms), plan_conf,
                  comparison=c)
        )  # fmt: skip
        return True

    def _rediagnose(self) -> bool:
        st = self.state
        inc = st.incumbent
        assert inc is not None
        left = self._left()
        # A profiled diagnosis of one arm: about a comparison's overhead for two arms.
        need = 2 * (self.overhead_per_arm or 0.0)
        if need > left + OVERRUN * self.budget_s * 0.5:
            self.stopped.append(
                f"the budget ran out before: re-diagnose {inc.label} (would need ~{need:.0f} s, "
                f"{max(0, left):.0f} s left)"
            )
            return False
        t0 = self.wall()
        st.rediagnosed = inc.label
        st.stages += 1
        note = ""
        try:
            found = _diagnose_arm(self.workload, inc.fixes, self.system, self.device_type)
        except GpuDiagError as exc:
            note = f"the best arm could not be diagnosed: {exc}"
            found = None
        if found is not None:
            from gpudiag.rules.finding import Severity

            self.next_bottleneck = tuple(
                f"{f.id}: {f.message}" for f in found.current() if f.severity is not Severity.INFO
            )[:5]
            new, skipped = from_evidence(
                self.workload,
                found,
                system=self.system,
                device_type=self.device_type,
                # A fix raced alone against the baseline is tried again with the best arm
                # when the best arm's own diagnosis points to it: its bottleneck is another
                # one (a DataLoader that did not limit a tiny batch may limit a large one).
                tried={*st.rediagnosed_fixes, *inc.fixes},
                from_workload=False,
            )
            ids = {f.id for f in inc.fixes}
            queued = {x.fix for x in st.remaining}
            new = [x for x in new if x.fix.id not in ids and x.fix not in queued]
            self.skipped += skipped
            for cand in new:
                st.tried.add(cand.fix)
                st.rediagnosed_fixes.add(cand.fix)
                st.remaining.append(cand)
            note = "recommends: " + (", ".join(x.label for x in new) or "nothing new to try")
        self.stages.append(Stage(st.stages, "re-diagnose", self.wall() - t0, note=note))
        return True

    def _multi_rank(self) -> bool:
        """The fixes measured across ranks (fsdp.wrap): one trial on ``nproc`` ranks against
        its own DDP baseline. Reported beside the search, never combined with its arms and
        never ``best`` (a different baseline)."""
        st = self.state
        cands = st.multi_rank
        left = self._left() + OVERRUN * self.budget_s * 0.5
        if left <= 0:
            self.stopped.append(f"the budget ran out before: the {self.nproc}-rank trial")
            return False
        st.multi_rank = []
        st.stages += 1
        index, name = st.stages, f"{self.nproc} ranks"
        t0 = self.wall()
        alpha = self._stage_alpha()
        st.tests += 1
        try:
            c = compare(
                self.workload, [x.fix for x in cands], nproc=self.nproc,
                seed=self.seed + index, confidence=1.0 - alpha,
                progress=self.progress or False, timeout_s=max(30.0, left),
            )  # fmt: skip
        except GpuDiagError as exc:
            for cand in cands:
                self._drop_unmeasured(index, name, cand.label, f"not measured on ranks: {exc}")
            self.stages.append(Stage(index, name, self.wall() - t0, note=str(exc)))
            return True
        for label, why in c.skipped:
            self._drop_unmeasured(index, name, label, f"skipped: {why}")
        for cand in cands:
            arm = _arm_of(c, (cand.fix,))
            if arm is None:
                continue
            why = self._why_dropped(c, arm)
            reason = why or (
                f"{arm.verdict} against DDP on {self.nproc} ranks: its own baseline, so it is "
                "not combined with the one-process arms"
            )
            status = DROPPED if why else MULTI_RANK
            self.history.append(self._arm(c, arm, index, name, status, reason, cand.source))
        self.stages.append(
            Stage(index, name, self.wall() - t0, tuple(a.label for a in c.arms), comparison=c)
        )
        return True

    # -- verdict helpers --------------------------------------------------------------------
    def _why_dropped(self, c: Comparison, arm: ArmResult) -> str:
        if arm.error:
            return f"failed: {arm.error}"
        if arm.verdict == NOT_APPLIED:
            return f"not applied: {arm.not_applied_reason}"
        if arm.drift is not None and arm.drift.status in DRIFT_BAD:
            return f"disqualified: loss/gradient drift is {arm.drift.status} ({arm.drift})"
        peak = arm.memory.peak_bytes if arm.memory is not None else None
        if self.memory_budget is not None and peak is not None and peak > self.memory_budget:
            return (
                f"over the memory budget: peak {peak / 2**20:,.0f} MiB > "
                f"{self.memory_budget / 2**20:,.0f} MiB"
            )
        if arm.verdict in ("slower", "no significant difference"):
            return (
                f"{arm.verdict} than the baseline"
                if arm.verdict == "slower"
                else ("no significant difference from the baseline")
            )
        return ""

    def _control(self, c: Comparison, index: int, name: str) -> None:
        arm = _arm_of(c, (Fix(CONTROL_ID),))
        if arm is None:
            return
        # Its Fix lives only while the search registers control.none: the record keeps none.
        aa = self._arm(c, arm, index, name, CONTROL, "A/A control: never kept", "the search")
        self.history.append(dataclasses.replace(aa, fixes=()))
        if arm.verdict in (FASTER, "slower"):
            self.warnings.append(
                f"the A/A control (an arm that changes nothing) was judged {arm.verdict} in "
                f"stage {index}: this machine's noise is beyond what the test allows for; "
                "treat this search's verdicts with care and rerun it on a quieter machine"
            )

    def _drop_unmeasured(self, index: int, name: str, label: str, why: str) -> None:
        fixes = tuple(Fix.parse(p) for p in label.split("+") if p)
        self.history.append(TunedArm(label, fixes, index, name, DROPPED, why))

    def _demote_incumbent(self) -> None:
        inc = self.state.incumbent
        if inc is None:
            return
        for i, a in enumerate(self.history):
            if a is inc:
                self.history[i] = dataclasses.replace(a, status=ACCEPTED)

    def _arm(
        self,
        c: Comparison,
        arm: ArmResult,
        index: int,
        name: str,
        status: str,
        reason: str,
        source: str,
    ) -> TunedArm:
        samples = arm.step_time.samples_s
        return TunedArm(
            label=arm.label,
            fixes=arm.fixes,
            stage=index,
            stage_name=name,
            status=status,
            reason=reason,
            source=source,
            verdict=arm.verdict,
            speedup=arm.speedup,
            verified=arm.verified,
            applied=arm.applied,
            rounds=len(samples),
            timed_s=float(sum(samples) * c.steps_per_sample) + (arm.first_step_s or 0.0),
            peak_memory_bytes=arm.memory.peak_bytes if arm.memory is not None else None,
            drift=str(arm.drift) if arm.drift is not None else "",
        )

    # -- resume and result ------------------------------------------------------------------
    def _resume(self, previous: TuneResult) -> None:
        if previous.state is None:
            raise ArgumentError("this result cannot be resumed (it has no search state)")
        self.state = copy.copy(previous.state)
        st = self.state
        st.pending, st.promising = list(st.pending), list(st.promising)
        st.multi_rank = list(st.multi_rank)
        st.remaining, st.tried = list(st.remaining), set(st.tried)
        st.rediagnosed_fixes = set(st.rediagnosed_fixes)
        st.race_speedup = dict(st.race_speedup)
        self.history = list(previous.history)
        self.stages = list(previous.stages)
        self.skipped = list(previous.skipped)
        self.candidates = list(previous.candidates)
        self.notes = [
            *(n for n in previous.notes if not n.startswith("the budget ran out")),
            f"resumed a search that had run {previous.elapsed_s:.0f} s; the time and budget "
            "above are this run's",
        ]
        self.warnings = list(previous.warnings)
        self.diagnosis = previous.diagnosis
        self.next_bottleneck = previous.next_bottleneck

    def _result(self) -> TuneResult:
        st = self.state
        open_work = st.open_work()
        not_reached = tuple(open_work)
        notes = [*self.notes, *dict.fromkeys(self.stopped)] if open_work else self.notes
        best = st.incumbent
        if best is None:
            best = TunedArm(
                "baseline", (), 0, "baseline", BEST,
                "no arm was faster than the baseline" + (" yet" if not_reached else ""),
            )  # fmt: skip
        measured = [s.comparison for s in self.stages if s.comparison is not None]
        hardware = measured[-1].hardware if measured else self.device_type
        alpha = self.alpha
        rule = (
            f"stage k's tests share {alpha:.0%}/2^k (half for the verdicts against the "
            "baseline, half over the combinations against the incumbent, Bonferroni): every "
            f"accepted step was decided, so the path to best is wrong with chance <= {alpha:.0%}"
        )
        return TuneResult(
            workload=self.workload.name,
            workload_description=self.workload.describe(),
            hardware=hardware,
            budget_s=self.budget_s,
            elapsed_s=self.wall() - self.started,
            best=best,
            history=tuple(self.history),
            stages=tuple(self.stages),
            candidates=tuple(self.candidates),
            skipped=tuple(dict.fromkeys(self.skipped)),
            not_reached=not_reached,
            next_bottleneck=self.next_bottleneck,
            error_control=rule,
            notes=tuple(notes),
            warnings=tuple(self.warnings),
            diagnosis=self.diagnosis,
            best_comparison=st.incumbent_comparison,
            state=st,
        )


# -- helpers ---------------------------------------------------------------------------------


@contextmanager
def _registered_control(registered: Any, spec: Any) -> Iterator[None]:
    """``control.none`` in the fix registry for the search (unless a caller registered it)."""
    from gpudiag.fixes.base import get_spec

    try:
        get_spec(CONTROL_ID)
    except GpuDiagError:
        with registered(spec):
            yield
        return
    yield


def _first_look(confidence: float, rounds: int) -> int:
    """The round of the first planned look of a comparison at ``confidence`` (tune's
    protocol): no verdict can come earlier."""
    min_rounds = max(5, _fewest(confidence))
    plan = VerdictPlan(min_rounds=min_rounds, max_rounds=max(min_rounds, rounds),
                       confidence=confidence)  # fmt: skip
    return plan.first_look


def _fewest(confidence: float) -> int:
    from gpudiag.analysis.verdict import fewest_rounds

    return fewest_rounds(confidence)


def _arm_of(c: Comparison, fixes: tuple[Fix, ...]) -> ArmResult | None:
    for arm in c.arms:
        if set(arm.fixes) == set(fixes):
            return arm
    return None


def _value(arm: ArmResult) -> float:
    return arm.speedup.value if arm.speedup is not None else 0.0


def _versus(
    c: Comparison, incumbent: ArmResult, challenger: ArmResult, confidence: float, tolerance: float
) -> Any:
    """The challenger against the incumbent on the rounds both ran (paired by round), in
    samples/s of the baseline's batch: ``judge`` with one look at that many rounds."""
    base = c.baseline.samples_per_step

    def scaled(arm: ArmResult) -> list[float]:
        per = arm.samples_per_step
        factor = base / per if base and per else 1.0
        return [t * factor for t in arm.step_time.samples_s]

    inc, ch = scaled(incumbent), scaled(challenger)
    n = min(len(inc), len(ch))
    plan = VerdictPlan(
        min_rounds=max(2, n), max_rounds=max(2, n), confidence=confidence, tolerance=tolerance,
        adaptive=False,
    )  # fmt: skip
    return judge(inc[:n], ch[:n], plan, final=True)


def _diagnose_arm(
    workload: Workload, fixes: tuple[Fix, ...], system: SystemReport | None, device_type: str
) -> Diagnosis:
    """``gd.diagnose`` of the step with ``fixes`` applied: the arm's own Step (on a copy of the
    model when gpudiag owns the step), profiled as a step function; the user's objects are
    restored afterwards."""
    from gpudiag.doctor import diagnose
    from gpudiag.experiment.runner import Arm
    from gpudiag.experiment.trial import isolated

    shared = not workload.owns_step
    model = workload.model if shared else copy.deepcopy(workload.model)
    label = "+".join(f.label for f in fixes)
    with isolated(*workload.protected):
        arm = Arm(label, fixes, workload, model, shared, device_type, system)
        arm.open()
        try:

            def step() -> Any:
                with arm.active():
                    loss, _ = arm.step(record=True)
                return loss

            wl = Workload.from_step(step, model=model, name=f"{workload.name} + {label}")
            return diagnose(wl, system=system, scaling=False, progress=False)
        finally:
            arm.close()


__all__ = ["tune"]
