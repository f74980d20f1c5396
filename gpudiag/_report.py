"""Shared plumbing for report objects: JSON-safe dicts and escaped HTML fragments."""

from __future__ import annotations

import dataclasses
import enum
import html
import math
from collections.abc import Iterable, Mapping
from typing import Any, cast


def jsonable(value: Any) -> Any:
    """Turn dataclasses, enums, tuples, sets and non-finite floats into JSON-safe values.

    NaN and infinities become ``None`` (JSON has no spelling for them).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return jsonable(item())
    return str(value)


class FieldsDict:
    """A dataclass whose ``to_dict`` is its fields in order, each as :func:`jsonable` writes
    it: the default for a result that only lists its fields (write ``to_dict`` by hand only
    where it adds or leaves out something)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.fields(cast(Any, self))
        return {f.name: jsonable(getattr(self, f.name)) for f in fields}


def esc(value: object) -> str:
    """HTML-escape anything, quotes included."""
    return html.escape(str(value), quote=True)


def html_table(rows: Iterable[tuple[object, object]], *, caption: str | None = None) -> str:
    """A two-column key/value table; every cell escaped."""
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{esc(k)}</th><td>{esc(v)}</td></tr>"
        for k, v in rows
    )
    cap = (
        f"<caption style='text-align:left;font-weight:bold'>{esc(caption)}</caption>"
        if caption
        else ""
    )
    return f"<table class='gpudiag-table'>{cap}{body}</table>"


def html_grid(header: Iterable[object], rows: Iterable[Iterable[object]]) -> str:
    """A table with a header row; every cell escaped."""
    head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f"<table class='gpudiag-table'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


# How a line below a result's table looks: the one palette of the HTML cards.
LINE_STYLES = {
    "plain": "",
    "note": "opacity:.7",
    "warning": "color:#b45309",
    "error": "color:#b00",
    "heading": "margin-top:6px;font-weight:600",
}


def html_lines(lines: Iterable[object], kind: str = "plain", *, prefix: str = "") -> str:
    """One ``<div>`` per line (escaped, after ``prefix``), styled as ``kind`` (LINE_STYLES)."""
    style = LINE_STYLES[kind]
    attr = f" style='{style}'" if style else ""
    return "".join(f"<div{attr}>{esc(prefix)}{esc(line)}</div>" for line in lines)


def card(title: str, inner_html: str, *, subtitle: str | None = None) -> str:
    """A bordered card; ``inner_html`` must already be escaped by the caller."""
    sub = f"<div style='opacity:.7'>{esc(subtitle)}</div>" if subtitle else ""
    return (
        "<div class='gpudiag-card' style='border:1px solid #8884;border-radius:6px;"
        "padding:8px 12px;margin:4px 0;font-family:system-ui,sans-serif;font-size:13px'>"
        f"<div style='font-weight:600;font-size:14px'>{esc(title)}</div>{sub}{inner_html}</div>"
    )
