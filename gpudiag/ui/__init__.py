"""Notebook widgets, registered as the widgets of the results they show.

Importing this package is light: each widget is registered by name and its module (and
ipywidgets) is imported the first time a result of that type asks for its view.
"""

from __future__ import annotations

from gpudiag import _views

_views.register("widget", "gpudiag.monitoring.sampler.Monitor", "gpudiag.ui.monitor:MonitorView")
