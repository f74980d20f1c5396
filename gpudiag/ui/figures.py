"""Results shown with their figures in a notebook: a Comparison as plot + table, figure widgets.

The domain objects (``Comparison``, ``Diagnosis``) know nothing of plots; this module composes
a result with the figure the plots layer draws for it, and registers that composition with
IPython so that a ``Comparison`` shown in a notebook carries its figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudiag import _views

if TYPE_CHECKING:
    from gpudiag.experiment.comparison import Comparison

_COMPARISON = ("gpudiag.experiment.comparison", "Comparison")


def figure_widget(figure: Any) -> Any:
    """A plotly figure as a widget (it draws in JupyterLab and in the classic notebook)."""
    import plotly.graph_objects as go

    return go.FigureWidget(figure)


def comparison_view(comparison: Comparison) -> Any:
    """The comparison figure (step-time distributions, speedup with its interval, peak memory)
    above the comparison's table; where widgets cannot be drawn (a terminal, nbconvert, a
    static page), the comparison's text and table."""
    import ipywidgets as widgets

    from gpudiag.ui.fallback import TextFallback

    class ComparisonView(TextFallback, widgets.VBox):
        def fallback_text(self) -> str:
            return repr(comparison)

        def fallback_html(self) -> str:
            return str(comparison._repr_html_())

    table = widgets.HTML(comparison._repr_html_(), layout=widgets.Layout(width="100%"))
    if not _timed(comparison):
        # Every fix was not applied (attention written by hand, say): no arm was timed, and
        # the figure would be two empty panels. The table says why.
        return ComparisonView([table], layout=widgets.Layout(width="100%"))
    return ComparisonView(
        [figure_widget(_views.build("figure", comparison)), table],
        layout=widgets.Layout(width="100%"),
    )


def _timed(comparison: Comparison) -> bool:
    """Whether any arm of ``comparison`` has step times to draw."""
    arms = [comparison.baseline, *comparison.arms]
    return any(arm.step_time.samples_s for arm in arms)


def _comparison_bundle(comparison: Comparison) -> dict[str, Any]:
    bundle: dict[str, Any] = comparison_view(comparison)._repr_mimebundle_()
    return bundle


def register_displays(ipython: Any) -> None:
    """Show a ``Comparison`` with its figure in this IPython shell (idempotent; by type name,
    so nothing is imported until a comparison is displayed)."""
    formatter = getattr(getattr(ipython, "display_formatter", None), "mimebundle_formatter", None)
    if formatter is not None:
        formatter.for_type_by_name(*_COMPARISON, _comparison_bundle)


def unregister_displays(ipython: Any) -> None:
    formatter = getattr(getattr(ipython, "display_formatter", None), "mimebundle_formatter", None)
    # A name registered again after the type was first shown sits both in IPython's deferred
    # printers and in its type printers; one pop takes only the first.
    while formatter is not None and formatter.pop(".".join(_COMPARISON), None) is not None:
        pass
