"""Runs the rules over the evidence at hand and ranks what they find."""

from __future__ import annotations

import importlib
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag._report import card, esc, jsonable

# The evidence lives in its own module (the families import it without a cycle); these
# names stay importable from here.
from gpudiag.rules.evidence import NEEDS, EvidenceBundle
from gpudiag.rules.finding import Evidence, Finding, NotEvaluated, Severity, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport
    from gpudiag.probe.system import SystemReport
    from gpudiag.step import Workload

__all__ = [
    "FAMILIES",
    "NEEDS",
    "REGISTRY",
    "REVISERS",
    "Diagnosis",
    "EvidenceBundle",
    "Reviser",
    "Rule",
    "RuleFn",
    "StepTime",
    "load_rules",
    "revises",
    "rule",
    "run_rules",
]

# One module per family of rules; each registers its rules with @rule on import.
FAMILIES: tuple[str, ...] = (
    "hardware",
    "environment",
    "capture",
    "input_pipeline",
    "precision",
    "shapes",
    "runtime",
    "launch",
    "sync",
    "memcpy",
    "communication",
    "occupancy",
    "kernels",
    "attention",
    "steps",
    "utilization",
    "cluster",
    "code",
    "topology",
    "memory",
)

# A rule yields findings, or NotEvaluated when its evidence exists but cannot tell.
RuleFn = Callable[[EvidenceBundle], Iterable[Finding | NotEvaluated]]


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    needs: tuple[str, ...]
    fn: RuleFn
    summary: str


REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str, *, category: str, needs: tuple[str, ...]) -> Callable[[RuleFn], RuleFn]:
    """Register a rule; its docstring's first line is its summary."""

    def register(fn: RuleFn) -> RuleFn:
        summary = (fn.__doc__ or rule_id).strip().splitlines()[0]
        REGISTRY[rule_id] = Rule(rule_id, category, needs, fn, summary)
        return fn

    return register


# A rule whose advice is a prediction (a micro-benchmark's) registers how its finding reads
# once a trial of its fix on the diagnosed workload has been measured in this process: the
# measurement replaces the prediction, in every diagnosis shown after it.
Reviser = Callable[[Finding, Any], Finding]
REVISERS: dict[str, Reviser] = {}


def revises(rule_id: str) -> Callable[[Reviser], Reviser]:
    """Register ``reviser(finding, workload)``: the finding of ``rule_id`` as it stands now."""

    def register(fn: Reviser) -> Reviser:
        REVISERS[rule_id] = fn
        return fn

    return register


def load_rules() -> dict[str, Rule]:
    for family in FAMILIES:
        importlib.import_module(f"gpudiag.rules.{family}")
    return REGISTRY


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


@dataclass(frozen=True)
class StepTime:
    """The step's own time (measured without the profiler, ``seconds``, with ``source``
    saying how) beside what one profiled step took (``profiled_s``: the trace's steps, whose
    time includes the profiler's overhead). Either may be None, with the reason in
    ``source``."""

    seconds: float | None
    source: str
    profiled_s: float | None = None

    def text(self) -> str:
        own = (
            f"step time {_ms(self.seconds)}, {self.source}"
            if self.seconds is not None
            else f"step time not measured without the profiler ({self.source})"
        )
        if self.profiled_s is None:
            return own
        return (
            f"{own}; a profiled step took {_ms(self.profiled_s)} (the profiler's overhead "
            "included: the trace's shares, not its durations, describe the step)"
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {"seconds": self.seconds, "source": self.source, "profiled_s": self.profiled_s}
        )


@dataclass(frozen=True)
class Diagnosis:
    """Findings ranked by severity, then estimated gain, and the rules that could not run."""

    findings: tuple[Finding, ...]
    not_evaluated: tuple[NotEvaluated, ...]
    evaluated: tuple[str, ...]
    sources: tuple[str, ...] = ()
    # The workload the evidence came from, so a fix can be tried on it (``try_fix``).
    workload: Workload | None = field(default=None, repr=False, compare=False)
    system: SystemReport | None = field(default=None, repr=False, compare=False)
    # The trace the findings read (a TraceReport), so a front end can show where time went.
    trace: TraceReport | None = field(default=None, repr=False, compare=False)
    # What ``try_fix`` runs: ``trial(workload, fixes, system=..., **options)``; set by the one
    # that diagnosed (``gd.diagnose`` hands ``gd.compare``), so the rules never run a trial.
    trial: Callable[..., Any] | None = field(default=None, repr=False, compare=False)
    # The diagnosed step's own time and the profiled step's (set by gd.diagnose).
    step_time: StepTime | None = field(default=None, repr=False, compare=False)

    def current(self) -> tuple[Finding, ...]:
        """The findings as they stand now, in their order: one whose advice was a
        micro-benchmark's prediction reads as the trial of its fix on this workload measured
        it, when ``gd.compare`` has measured one in this process since (see ``revises``)."""
        if self.workload is None or not REVISERS:
            return self.findings
        return tuple(
            REVISERS[f.rule](f, self.workload) if f.rule in REVISERS else f for f in self.findings
        )

    def recommended(self) -> list[Any]:
        """The ``gd.Fix`` objects worth trying, best first (one per fix id)."""
        fixes, seen = [], set()
        for f in self.current():
            if f.fix is not None and f.severity is not Severity.INFO and f.fix.id not in seen:
                seen.add(f.fix.id)
                fixes.append(f.fix.to_fix())
        return fixes

    def try_fix(self, which: int | str | Any = 0, **compare_options: Any) -> Any:
        """Try a recommended fix on the diagnosed workload with ``gd.compare`` (the notebook
        spelling of "Try it"): ``which`` is an index into ``recommended()``, a fix id, or a
        ``gd.Fix``. ``compare_options`` go to ``gd.compare`` (``time_budget_s=``, ...).

        A fix that needs parameters the diagnosis did not give (``"batch.size"`` when no
        finding recommended a size) is refused with what to give (``batch.size=N``): tried
        as it is, it would measure a copy of the baseline.
        """
        from gpudiag.errors import FixError, GpuDiagError

        if self.workload is None:
            raise GpuDiagError(
                "this diagnosis has no workload to try a fix on: run "
                "gd.diagnose(workload=...) (or gd.compare(workload, fixes=[...]) directly)"
            )
        fixes = self.recommended()
        if isinstance(which, int):
            if not 0 <= which < len(fixes):
                raise GpuDiagError(
                    f"no recommended fix number {which}: this diagnosis recommends "
                    f"{len(fixes)} ({', '.join(f.id for f in fixes) or 'none'})"
                )
            fix = fixes[which]
        elif isinstance(which, str):
            found = [f for f in fixes if f.id == which]
            if not found:
                from gpudiag.fixes import Fix

                found = [Fix.parse(which)]
            fix = found[0]
        else:
            fix = which
        from gpudiag.fixes import Fix

        missing = Fix.coerce(fix).missing()
        if missing:
            raise FixError(missing)
        if self.trial is None:
            raise GpuDiagError(
                "this diagnosis has no trial runner: make it with gd.diagnose(workload=...) "
                "(or run gd.compare(workload, fixes=[...]) directly)"
            )
        return self.trial(self.workload, [fix], system=self.system, **compare_options)

    def by_severity(self, severity: Severity | str) -> list[Finding]:
        sev = Severity(severity)
        return [f for f in self.findings if f.severity is sev]

    def ids(self) -> list[str]:
        return [f.id for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.current()],
            "not_evaluated": [jsonable(n) for n in self.not_evaluated],
            "evaluated": list(self.evaluated),
            "sources": list(self.sources),
            "step_time": jsonable(self.step_time),
        }

    def lines(self) -> list[str]:
        n = len(self.findings)
        out = [
            f"gpudiag diagnose: {n} finding{'' if n == 1 else 's'} "
            f"({', '.join(self.sources) or 'no evidence'})"
        ]
        if self.step_time is not None:
            out.append(f"  {self.step_time.text()}")
        for f in self.current():
            out += f.lines()
        if not self.findings:
            out.append("no findings from the rules that could run")
        out += self._not_evaluated_lines()
        return out

    def _not_evaluated_lines(self) -> list[str]:
        """The rules that could not run, one line per missing piece of evidence."""
        by_missing = group_not_evaluated(self.not_evaluated)
        if not by_missing:
            return []
        out = [f"  not evaluated ({len(self.not_evaluated)} rules), by what they lack:"]
        for missing, rules in by_missing.items():
            out += textwrap.wrap(
                f"{missing}: {', '.join(rules)}",
                width=100,
                initial_indent="    - ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        body = "".join(f.html() for f in self.current()) or "<p>No findings.</p>"
        if self.step_time is not None:
            body = f"<div class='gpudiag-step-time'>{esc(self.step_time.text())}</div>" + body
        body += self._try_hint_html()
        if self.not_evaluated:
            body += not_evaluated_html(self.not_evaluated)
        return card("gpudiag diagnose", body, subtitle=", ".join(self.sources))

    def _try_hint_html(self) -> str:
        """How to try the fixes from this card, which has no Try buttons (the widget card of
        ``%gpudiag doctor`` has them): empty when nothing can be tried here."""
        fixes = self.recommended() if self.workload is not None and self.trial else []
        if not fixes:
            return ""
        return (
            "<div class='gpudiag-try-hint' style='opacity:.7'>To try a fix on this workload: "
            f"<code>{esc(f'd.try_fix({fixes[0].id!r})')}</code> (d: this diagnosis), or "
            "<code>%gpudiag doctor --workload wl</code> (wl: the workload) for this card with "
            "a Try button per finding.</div>"
        )


def group_not_evaluated(skipped: Iterable[NotEvaluated]) -> dict[str, list[str]]:
    """What the rules that could not run lack -> those rules, in the order they came."""
    by_missing: dict[str, list[str]] = {}
    for n in skipped:
        by_missing.setdefault(n.missing, []).append(n.rule)
    return by_missing


def not_evaluated_html(skipped: Iterable[NotEvaluated]) -> str:
    """A folded list of the rules that could not run, grouped by what they lack."""
    by_missing = group_not_evaluated(skipped)
    count = sum(len(rules) for rules in by_missing.values())
    items = "".join(
        f"<li>lacking {esc(missing)}: {esc(', '.join(rules))}</li>"
        for missing, rules in by_missing.items()
    )
    return f"<details><summary>{count} rules not evaluated</summary><ul>{items}</ul></details>"


# A finding without a gain estimate ranks as if it saved this share of the run.
_DEFAULT_GAIN = {Severity.HIGH: 0.20, Severity.MEDIUM: 0.08, Severity.LOW: 0.02, Severity.INFO: 0.0}


def _rank_key(f: Finding) -> tuple[int, float]:
    """Severity first, then estimated gain: a MEDIUM is never listed above a HIGH."""
    gain = f.estimated_gain if f.estimated_gain is not None else _DEFAULT_GAIN[f.severity]
    return (-f.severity.rank, -gain)


def run_rules(
    evidence: EvidenceBundle,
    *,
    only: Iterable[str] | None = None,
    trial: Callable[..., Any] | None = None,
) -> Diagnosis:
    """The findings of every rule (or the ``only`` ones) over ``evidence``, ranked; ``trial``
    is what the diagnosis's ``try_fix`` runs (see ``Diagnosis.trial``)."""
    rules = load_rules()
    wanted = set(only) if only is not None else None
    findings: list[Finding] = []
    skipped: list[NotEvaluated] = []
    evaluated: list[str] = []
    too_small = _too_small(evidence)
    for r in rules.values():
        if wanted is not None and r.id not in wanted:
            continue
        missing = [NEEDS.get(n, n) for n in r.needs if not evidence.has(n)]
        if missing:
            skipped.append(NotEvaluated(r.id, ", ".join(missing)))
            continue
        evaluated.append(r.id)
        for f in r.fn(evidence):
            if isinstance(f, NotEvaluated):
                skipped.append(f)
            else:
                f = _sized(f if f.rule else _with_rule(f, r.id))
                if too_small is not None and _from_trace(r):
                    f = _unjudged(f)
                findings.append(f)
    if too_small is not None:
        findings.append(_too_small_finding(evidence, too_small))
    findings.sort(key=_rank_key)
    sources = []
    if evidence.system is not None:
        sources.append("recording" if evidence.system.is_recording else "live system")
    if evidence.trace is not None:
        sources.append("trace")
    if evidence.samples is not None:
        sources.append("monitor samples")
    if evidence.code is not None:
        sources.append("source code")
    if evidence.runtime:
        sources.append("torch switches")
    if evidence.batch_scaling is not None:
        sources.append("batch scaling")
    if evidence.memory is not None:
        sources.append("memory")
    return Diagnosis(
        tuple(findings),
        tuple(skipped),
        tuple(evaluated),
        tuple(sources),
        workload=evidence.workload,
        system=evidence.system,
        trace=evidence.trace,
        trial=trial,
    )


def _too_small(evidence: EvidenceBundle) -> str | None:
    from gpudiag.rules._facts import trace_too_small

    return trace_too_small(evidence.trace)


def _from_trace(r: Rule) -> bool:
    return "trace" in r.needs or "gpu_trace" in r.needs


def _sized(f: Finding) -> Finding:
    """A finding with an estimated gain gets the severity that gain of the run earns (HIGH
    from 10 %, MEDIUM from 3 %; README), raised or lowered; information stays information."""
    import dataclasses

    if f.estimated_gain is None or f.severity is Severity.INFO:
        return f
    earned = severity_for_gain(f.estimated_gain)
    return dataclasses.replace(f, severity=earned) if f.severity is not earned else f


def _unjudged(f: Finding) -> Finding:
    """A trace finding from a trace too small to judge by: kept, as information only."""
    import dataclasses

    return dataclasses.replace(
        f,
        severity=Severity.INFO,
        estimated_gain=None,
        message=f.message + " (from a trace too small to judge a run by)",
    )


def _too_small_finding(evidence: EvidenceBundle, why: str) -> Finding:
    from gpudiag.rules._facts import trace_source

    return Finding(
        "trace.too_small",
        Severity.LOW,
        "trace",
        "the trace holds too little GPU work for a claim about the run: its findings are "
        "information only",
        (Evidence("trace size", why, source=trace_source(evidence.trace)),),
        threshold="under 0.5 ms of kernel time in the window (however many kernels)",
        instruction="profile several full training steps (torch.profiler schedule with "
        "warmup=1, active=3 and prof.step() per step) and diagnose that trace",
        rule="trace.too_small",
    )


def _with_rule(f: Finding, rule_id: str) -> Finding:
    import dataclasses

    return dataclasses.replace(f, rule=rule_id)
