"""Views of results (figures, widgets, HTML cards), registered by the presentation layer by
type name.

The domain never imports the presentation layer: a result's ``.plot()`` asks this registry
for the figure registered for its type. ``gpudiag.plots`` and ``gpudiag.ui`` register theirs
when they are imported, by name (``"module:function"``), so registering imports nothing heavy.
The package facade names them as providers, so the first ``.plot()`` loads them. Types are
keyed by name, as IPython's ``for_type_by_name`` in ``gpudiag.ui.figures``: nothing is
imported before a view is asked for.

A result shown as a card is :class:`Carded`: it says what its card holds (``as_card()``: a
:class:`Card` of facts, grids and lines, in order) and its ``_repr_html_`` is the ``"html"``
view registered for ``Carded``, one renderer for every card.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from gpudiag.errors import ViewError

ViewKind = Literal["figure", "widget", "html"]
# How a line below a card's tables reads: plain, a note (faded), a warning, an error, or the
# heading of the table after it.
LineKind = Literal["plain", "note", "warning", "error", "heading"]

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


# -- cards: what a result shows, apart from how it is drawn ---------------------------------


@dataclass(frozen=True)
class Facts:
    """A key/value table (``caption`` above it)."""

    rows: Sequence[tuple[object, object]]
    caption: str | None = None


@dataclass(frozen=True)
class Grid:
    """A table with a header row."""

    header: Sequence[object]
    rows: Sequence[Sequence[object]]


@dataclass(frozen=True)
class Lines:
    """Lines of text below the tables, each after ``prefix``, read as ``kind``."""

    lines: Sequence[object]
    kind: LineKind = "plain"
    prefix: str = ""


Block = Facts | Grid | Lines


@dataclass(frozen=True)
class Card:
    """A result's card: a title, an optional subtitle and its blocks in order."""

    title: str
    blocks: Sequence[Block]
    subtitle: str | None = None


class Carded:
    """A result shown as a card: ``as_card()`` gives the facts, the ``"html"`` view draws them."""

    __slots__ = ()

    def as_card(self) -> Card:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return cast(str, build("html", self))
