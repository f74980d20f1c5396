"""Views of results (figures, widgets), registered by the presentation layer by type name.

The domain never imports the presentation layer: a result's ``.plot()`` asks this registry
for the figure registered for its type. ``gpudiag.plots`` and ``gpudiag.ui`` register theirs
when they are imported, by name (``"module:function"``), so registering imports nothing heavy.
The package facade names them as providers, so the first ``.plot()`` loads them. Types are
keyed by name, as IPython's ``for_type_by_name`` in ``gpudiag.ui.figures``: nothing is
imported before a view is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

from gpudiag.errors import ViewError

ViewKind = Literal["figure", "widget"]

# (kind, "module.Type") -> a builder, or "module:attribute" naming it
_views: dict[tuple[str, str], Callable[..., Any] | str] = {}
# modules that register views when imported, loaded once on the first miss
_providers: list[str] = []
_loaded: set[str] = set()


def type_name(cls: type) -> str:
    """``"gpudiag.analysis.roofline.Roofline"`` for ``Roofline``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register(kind: ViewKind, type_name: str, builder: Callable[..., Any] | str) -> None:
    """``builder(result, *args)`` draws ``kind`` for results of ``type_name``; a string
    ``"module:attribute"`` is imported on first use."""
    _views[(kind, type_name)] = builder


def add_provider(module: str) -> None:
    """A module that registers views when imported (the presentation layer's packages)."""
    if module not in _providers:
        _providers.append(module)


def _registered(kind: str, cls: type) -> tuple[str, Callable[..., Any] | str] | None:
    """The view registered for ``cls`` or its nearest base class."""
    for base in cls.__mro__:
        name = type_name(base)
        if (kind, name) in _views:
            return name, _views[(kind, name)]
    return None


def build(kind: ViewKind, result: object, *args: Any) -> Any:
    """The ``kind`` view of ``result`` (extra ``args`` go to the builder)."""
    found = _registered(kind, type(result))
    for module in _providers:
        if found is not None:
            break
        if module not in _loaded:
            _loaded.add(module)
            importlib.import_module(module)
            found = _registered(kind, type(result))
    if found is None:
        raise ViewError(
            f"no {kind} is registered for {type_name(type(result))}: import the module that "
            "draws it (gpudiag.plots for figures, gpudiag.ui for widgets)"
        )
    name, builder = found
    if isinstance(builder, str):
        module, _, attribute = builder.partition(":")
        builder = getattr(importlib.import_module(module), attribute)
        _views[(kind, name)] = builder
    return builder(result, *args)
