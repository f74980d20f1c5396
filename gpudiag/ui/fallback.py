"""What a widget shows where widgets cannot be drawn: its result's text report and HTML.

A widget's own ``text/plain`` is its Python repr (``DiagnosisView(children=(HTML(value=...``),
which is all a terminal IPython, a Jupyter console or nbconvert has to show. The views here
put the result's text report there, and its HTML card beside the widget's view, so a front
end without widgets shows the same report a notebook does; one with widgets still draws the
widget (it ranks the widget's own MIME type first).
"""

from __future__ import annotations

from typing import Any


class TextFallback:
    """Mixed into an ipywidgets container: ``fallback_text()`` and ``fallback_html()`` say
    what to show instead of the widget."""

    def fallback_text(self) -> str:
        raise NotImplementedError

    def fallback_html(self) -> str | None:
        return None

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = super()._repr_mimebundle_(**kwargs) or {}  # type: ignore[misc]
        bundle["text/plain"] = self.fallback_text()
        html = self.fallback_html()
        if html is not None:
            bundle["text/html"] = html
        return bundle
