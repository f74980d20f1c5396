"""The diagnosis card as widgets: each finding with a "Try it" button that runs gd.compare."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from gpudiag._report import esc
from gpudiag.errors import GpuDiagError


class DiagnosisView(widgets.VBox):
    """Findings of a ``Diagnosis``; a finding whose fix can be tried gets a "Try it" button.

    A click runs ``diagnosis.try_fix(fix, **compare_options)`` (``gd.compare`` on the diagnosed
    workload, in isolated trials) and shows the comparison beside the finding. Without a
    workload, or for a fix gpudiag cannot apply live (advice, environment), the button is
    disabled and says why.
    """

    def __init__(self, diagnosis: Any, **compare_options: Any) -> None:
        self.diagnosis = diagnosis
        self.compare_options = {"progress": False, **compare_options}
        self.buttons: list[widgets.Button] = []
        self.outputs: list[widgets.Output] = []
        self.results: dict[int, Any] = {}
        header = widgets.HTML(
            f"<b>gpudiag diagnose</b>: {len(diagnosis.findings)} findings "
            f"({esc(', '.join(diagnosis.sources) or 'no evidence')})"
        )
        rows: list[widgets.Widget] = [header]
        for index, finding in enumerate(diagnosis.findings):
            rows.append(self._row(index, finding))
        if diagnosis.not_evaluated:
            items = "".join(f"<li>{esc(n)}</li>" for n in diagnosis.not_evaluated)
            rows.append(
                widgets.HTML(f"<details><summary>not evaluated</summary><ul>{items}</ul></details>")
            )
        super().__init__(rows)

    def _row(self, index: int, finding: Any) -> widgets.Widget:
        card = widgets.HTML(finding.html(), layout=widgets.Layout(flex="1 1 60%"))
        if finding.fix is None:
            return card
        button = widgets.Button(description=f"Try {finding.fix}", icon="play")
        button.layout.width = "auto"
        out = widgets.Output(layout=widgets.Layout(flex="1 1 40%", overflow="auto"))
        blocker = finding.fix.to_fix().live_blocker()
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
        side = widgets.VBox([button, out], layout=widgets.Layout(flex="1 1 40%"))
        return widgets.HBox([card, side])

    def try_finding(self, index: int) -> Any:
        """Run the finding's fix (what the button does); the comparison is shown and returned."""
        finding = self.diagnosis.findings[index]
        slot = [i for i, f in enumerate(self.diagnosis.findings) if f.fix is not None].index(index)
        button, out = self.buttons[slot], self.outputs[slot]
        button.disabled = True
        button.description = f"running {finding.fix} ..."
        out.clear_output()
        try:
            result = self.diagnosis.try_fix(finding.fix.to_fix(), **self.compare_options)
        except GpuDiagError as exc:
            with out:
                print(f"gpudiag: {exc}")
            result = None
        finally:
            button.disabled = False
            button.description = f"Try {finding.fix} again"
        if result is not None:
            self.results[index] = result
            with out:
                from IPython.display import display

                display(result)
        return result
