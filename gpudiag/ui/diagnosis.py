"""The diagnosis card as widgets: each finding with a "Try it" button that runs gd.compare."""

from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as widgets

from gpudiag._progress import ProgressBar
from gpudiag._report import esc
from gpudiag.errors import GpuDiagError
from gpudiag.rules.engine import not_evaluated_html
from gpudiag.ui.fallback import TextFallback

_FULL = widgets.Layout(width="100%")
_OUTCOME_COLORS = {"faster": "#2e7d32", "slower": "#c62828", "not applied": "#ef6c00"}
# Verdicts that say a fix, proven to take effect, did not help: only these retract the advice.
_DID_NOT_HELP = ("slower", "no significant difference")
_NEUTRAL = "#546e7a"


@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """What a Try-it comparison measured for one fix: in words, its verdict, whether it helped.

    A fix helped when ``Comparison.kept()`` keeps it: faster, or (a memory fix) peak memory
    cut enough, without large drift. Slower, no different, failed or not measured did not.
    ``retracts``: the measurement says the fix, shown to take effect, does not help here
    (slower, or no significant difference), so the card stops recommending it; a fix that
    could not be applied live, or an undecided measurement, keeps the finding's own advice.
    """

    text: str
    helped: bool
    verdict: str | None = None
    retracts: bool = False


def trial_outcome(result: Any, fix: Any) -> TrialOutcome:
    try:
        arm = result.arm(fix)
    except GpuDiagError as exc:
        return TrialOutcome(f"not measured: {exc}", False)
    if arm.verdict == "not applied":
        return TrialOutcome(
            f"could not be applied live: {arm.not_applied_reason}", False, arm.verdict
        )
    if arm.error is not None or arm.verdict is None or arm.speedup is None:
        return TrialOutcome(f"{arm.label} failed: {arm.error or 'not measured'}", False)
    helped = any(a.label == arm.label for a in result.kept())
    if arm.verdict == "undecided":
        text = f"{arm.label} undecided here ({arm.speedup}): {arm.needs}"
    else:
        text = f"{arm.label} measured {arm.verdict} here: {arm.speedup}"
    if not arm.verified:
        text += f" (unverified: {arm.unverified_reason or 'no proof the fix took effect'})"
    saving = result.memory_saving(arm)
    if saving > 0:
        text += f", peak memory {saving:.0%} lower"
    retracts = not helped and arm.verdict in _DID_NOT_HELP
    return TrialOutcome(text, helped, arm.verdict, retracts)


class DiagnosisView(TextFallback, widgets.VBox):
    """Findings of a ``Diagnosis``, full width; a finding whose fix can be tried gets a "Try it"
    button, and the comparison appears below the finding.

    A click runs ``diagnosis.try_fix(fix, **compare_options)`` (``gd.compare`` on the diagnosed
    workload, in isolated trials). The finding's card then says what was measured; a fix that
    came back slower or no different is marked so and no longer recommends itself. Without a
    workload, or for a fix gpudiag cannot apply live (advice, environment), the button is
    disabled and says why. ``note`` (what was diagnosed) and ``figure`` (a plotly figure: where
    the step's time goes) are shown above the findings.
    """

    def __init__(
        self, diagnosis: Any, *, note: str = "", figure: Any = None, **compare_options: Any
    ) -> None:
        self.diagnosis = diagnosis
        self.note = note
        self.compare_options = dict(compare_options)
        self.buttons: list[widgets.Button] = []
        self.outputs: list[widgets.Output] = []
        self.cards: dict[int, widgets.HTML] = {}
        self.results: dict[int, Any] = {}
        self.shown: dict[int, Any] = {}  # what appears below each tried finding
        self.outcomes: dict[int, TrialOutcome] = {}
        # The step's own time (not the profiled step's) under the header line.
        step_time = (
            f"<div class='gpudiag-step-time'>{esc(diagnosis.step_time.text())}</div>"
            if diagnosis.step_time is not None
            else ""
        )
        header = widgets.HTML(
            f"<b>gpudiag diagnose</b>: {len(diagnosis.findings)} findings "
            f"({esc(', '.join(diagnosis.sources) or 'no evidence')}){step_time}",
            layout=_FULL,
        )
        rows: list[widgets.Widget] = [header]
        if note:
            rows.append(widgets.HTML(f"<div class='gpudiag-note'>{esc(note)}</div>", layout=_FULL))
        if figure is not None:
            from gpudiag.ui.figures import figure_widget

            rows.append(figure_widget(figure))
        # As the findings stand now: a trial measured since replaces a micro-benchmark's advice.
        for index, finding in enumerate(diagnosis.current()):
            rows.append(self._row(index, finding))
        if diagnosis.not_evaluated:
            rows.append(widgets.HTML(not_evaluated_html(diagnosis.not_evaluated), layout=_FULL))
        super().__init__(rows, layout=widgets.Layout(width="100%"))

    def fallback_text(self) -> str:
        """The diagnosis's text report (after the note), where widgets cannot be drawn."""
        return "\n".join([self.note, repr(self.diagnosis)] if self.note else [repr(self.diagnosis)])

    def fallback_html(self) -> str:
        note = f"<div class='gpudiag-note'>{esc(self.note)}</div>" if self.note else ""
        return note + str(self.diagnosis._repr_html_())

    def _card_html(self, index: int) -> str:
        finding = self.diagnosis.findings[index]
        outcome = self.outcomes.get(index)
        if outcome is None:
            return str(finding.html())
        if outcome.retracts:
            # Measured here, it took effect and did not help: the card stops recommending it.
            finding = dataclasses.replace(
                finding, fix=None, instruction=f"keep it as it is: {finding.fix} did not help here"
            )
        colour = _OUTCOME_COLORS.get(outcome.verdict or "", _NEUTRAL)
        if outcome.verdict == "not applied":
            mark = "tried, could not be applied live"
        elif outcome.helped:
            mark = "tried, helped"
        elif outcome.retracts:
            mark = "tried, did not help"
        else:
            mark = "tried, undecided" if outcome.verdict == "undecided" else "tried, failed"
        banner = (
            f"<div class='gpudiag-trial' style='border-left:3px solid {colour};padding-left:6px;"
            f"margin-top:2px'><b style='color:{colour}'>{esc(mark)}</b>: "
            f"{esc(outcome.text)}</div>"
        )
        return str(finding.html()) + banner

    def _row(self, index: int, finding: Any) -> widgets.Widget:
        card = widgets.HTML(finding.html(), layout=_FULL)
        self.cards[index] = card
        if finding.fix is None:
            return card
        button = widgets.Button(description=f"Try {finding.fix}", icon="play")
        button.layout.width = "auto"
        out = widgets.Output(layout=_FULL)
        blocker = finding.fix.live_blocker() or finding.fix.missing()
        if self.diagnosis.workload is None:
            button.disabled = True
            button.tooltip = "no workload: run gd.diagnose(workload=...) to try fixes here"
        elif blocker:
            button.disabled = True
            button.tooltip = blocker
            with out:
                print(blocker)
        button.on_click(lambda _b, i=index: self.try_finding(i))
        self.buttons.append(button)
        self.outputs.append(out)
        return widgets.VBox([card, button, out], layout=_FULL)

    def try_finding(self, index: int) -> Any:
        """Run the finding's fix (what the button does); the comparison is shown below the
        finding and returned, and the finding's card says what was measured."""
        finding = self.diagnosis.findings[index]
        slot = [i for i, f in enumerate(self.diagnosis.findings) if f.fix is not None].index(index)
        button, out = self.buttons[slot], self.outputs[slot]
        button.disabled = True
        button.description = f"running {finding.fix} ..."
        out.clear_output()
        fix = finding.fix
        options = dict(self.compare_options)
        # A button callback has no cell of its own: the bar is drawn in the finding's output.
        options.setdefault("progress", ProgressBar(f"Try {finding.fix}", output=out))
        diagnosis = self.diagnosis
        if diagnosis.trial is None:  # built by hand, not by gd.diagnose: the UI runs the trial
            from gpudiag.doctor import run_trial

            diagnosis = dataclasses.replace(diagnosis, trial=run_trial)
        try:
            result = diagnosis.try_fix(fix, **options)
        except GpuDiagError as exc:
            with out:
                print(f"gpudiag: {exc}")
            result = None
        finally:
            button.disabled = False
            button.description = f"Try {finding.fix} again"
        if result is not None:
            self.results[index] = result
            if hasattr(result, "arm"):
                self.outcomes[index] = trial_outcome(result, fix)
                outcome = self.outcomes[index]
                button.button_style = (
                    "" if outcome.helped or outcome.verdict == "undecided" else ("warning")
                )
                self.cards[index].value = self._card_html(index)
            from gpudiag.ui.figures import comparison_view

            self.shown[index] = comparison_view(result) if hasattr(result, "arm") else result
            with out:
                from IPython.display import display

                display(self.shown[index])
        return result
