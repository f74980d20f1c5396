"""Notebook widgets and HTML cards, registered as the views of the results they show.

Importing this package is light: each widget is registered by name and its module (and
ipywidgets) is imported the first time a result of that type asks for its view. Every
``_views.Carded`` result's HTML is drawn by ``gpudiag.ui.card``.
"""

from __future__ import annotations

from gpudiag import _views

_views.register("widget", "gpudiag.monitoring.sampler.Monitor", "gpudiag.ui.monitor:MonitorView")
_views.register("html", "gpudiag._views.Carded", "gpudiag.ui.card:card_html")
