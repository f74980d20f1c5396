"""A finding shaped like a DCGM diagnostic: id, severity, category, evidence, message, next step."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gpudiag._report import esc, jsonable
from gpudiag.fixes import Fix


class Severity(str, enum.Enum):
    HIGH = "high"  # costs a large share of the run, or a fault
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"  # worth knowing, nothing to change

    @property
    def rank(self) -> int:
        return {"high": 3, "medium": 2, "low": 1, "info": 0}[self.value]


# Severity follows the estimated gain over the whole run (not a share of compute time): a
# tenth of the run is worth acting on first, a few percent is worth a try, less is a detail.
HIGH_GAIN = 0.10
MEDIUM_GAIN = 0.03


def severity_for_gain(gain: float) -> Severity:
    """The severity that an estimated gain (a fraction of the whole run) earns."""
    if gain >= HIGH_GAIN:
        return Severity.HIGH
    return Severity.MEDIUM if gain >= MEDIUM_GAIN else Severity.LOW


@dataclass(frozen=True, slots=True)
class Evidence:
    """One number behind a finding, with its unit and where it came from."""

    name: str
    value: Any
    unit: str = ""
    source: str = ""  # "nvml", "nvidia-smi xml", "trace: rank0.json", "environment", ...

    def __str__(self) -> str:
        value = str(self.value)
        if isinstance(self.value, float):
            # Three significant digits, but never an exponent for a large figure (1.01e+05).
            value = f"{self.value:,.0f}" if abs(self.value) >= 1e4 else f"{self.value:.3g}"
        unit = f" {self.unit}" if self.unit else ""
        source = f" [{self.source}]" if self.source else ""
        return f"{self.name} = {value}{unit}{source}"


# A finding's next step is a gd.Fix, the one type of a fix (finding, trial arm, recipe entry):
# ``FixRef("batch.size", {"micro_batch": 16})`` is ``Fix("batch.size", {"micro_batch": 16})``.
FixRef = Fix


@dataclass(frozen=True, slots=True)
class Finding:
    """What a rule found. ``fix`` can be tried live; ``instruction`` is what to do otherwise."""

    id: str  # stable: "precision.fp32_on_tensor_cores", "hw.pcie_link_degraded", ...
    severity: Severity
    category: str  # "precision", "hardware", "input pipeline", ...
    message: str  # one line
    evidence: tuple[Evidence, ...] = ()
    threshold: str = ""  # the rule's trigger, in words: "DataLoader > 5 % of step time"
    fix: Fix | None = None
    instruction: str = ""
    estimated_gain: float | None = None  # fraction of step time the fix could save, when known
    rule: str = ""
    # The time-ledger rows the finding is a claim on (its gain is their time x the share its
    # fix can remove; see gpudiag.rules._claims).
    claims: tuple[str, ...] = ()

    @property
    def gain_text(self) -> str:
        gain = self.estimated_gain or 0.0
        share = f"{gain:.0%}" if gain >= 0.01 else "under 1%"
        return f"up to {share} of the run (estimate)"

    @property
    def next_step(self) -> str:
        if self.fix is not None:
            return f"try {self.fix}" + (f": {self.instruction}" if self.instruction else "")
        return self.instruction

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "category": self.category,
            "message": self.message,
            "evidence": [jsonable(e) for e in self.evidence],
            "threshold": self.threshold,
            "fix": None
            if self.fix is None
            else {"id": self.fix.id, "params": jsonable(self.fix.params)},
            "instruction": self.instruction,
            "estimated_gain": self.estimated_gain,
            "rule": self.rule,
            "claims": list(self.claims),
        }

    def lines(self) -> list[str]:
        out = [f"[{self.severity.value.upper()}] {self.id}: {self.message}"]
        out += [f"    evidence: {e}" for e in self.evidence]
        if self.threshold:
            out.append(f"    rule: {self.threshold}")
        if self.estimated_gain:
            out.append(f"    gain: {self.gain_text}")
        if self.next_step:
            out.append(f"    next: {self.next_step}")
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def html(self) -> str:
        colour = {"high": "#c62828", "medium": "#ef6c00", "low": "#1565c0", "info": "#607d8b"}
        evidence = "".join(f"<li>{esc(e)}</li>" for e in self.evidence)
        return (
            f"<div class='gpudiag-finding' data-id='{esc(self.id)}'>"
            f"<b style='color:{colour[self.severity.value]}'>"
            f"{esc(self.severity.value.upper())}</b> "
            f"<code>{esc(self.id)}</code>: {esc(self.message)}"
            f"<ul style='margin:2px 0'>{evidence}</ul>"
            + (f"<div>rule: {esc(self.threshold)}</div>" if self.threshold else "")
            + (f"<div>gain: {esc(self.gain_text)}</div>" if self.estimated_gain else "")
            + (f"<div>next: {esc(self.next_step)}</div>" if self.next_step else "")
            + "</div>"
        )


@dataclass(frozen=True, slots=True)
class NotEvaluated:
    """A rule that could not run, and which evidence it lacked: never a silent pass."""

    rule: str
    missing: str

    def __str__(self) -> str:
        return f"not evaluated: {self.rule} (missing {self.missing})"
