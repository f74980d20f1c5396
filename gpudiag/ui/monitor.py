"""The live monitor widget: an anywidget strip-chart grid and an ipywidgets control bar."""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import numpy as np
import traitlets

from gpudiag.errors import GpuDiagError
from gpudiag.monitoring import Monitor
from gpudiag.monitoring.metrics import (
    DEFAULT_GPU_METRICS,
    DEFAULT_HOST_METRICS,
    metric_spec,
)
from gpudiag.monitoring.projection import (
    EVERY_GPU_LIMIT,
    Projection,
    by_node,
    every_device,
    nodes_of,
    one_node,
)
from gpudiag.ui.fallback import TextFallback

WINDOW_CHOICES_S: tuple[tuple[str, float], ...] = (
    ("30 s", 30.0),
    ("1 min", 60.0),
    ("2 min", 120.0),
    ("5 min", 300.0),
    ("10 min", 600.0),
)
# The browser keeps at most this much per series; longer history stays in the kernel.
MAX_BROWSER_WINDOW_S = 600.0


def widget_asset(name: str) -> str:
    """Text of a browser file: inside an installed wheel (``gpudiag/_widgets``), else the
    source tree's top-level ``widgets/`` folder."""
    try:
        packaged = resources.files("gpudiag").joinpath("_widgets").joinpath(name)
        if packaged.is_file():
            return packaged.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError):
        pass
    source = Path(__file__).resolve().parents[2] / "widgets" / name
    if source.is_file():
        return source.read_text(encoding="utf-8")
    raise GpuDiagError(
        f"the widget file {name} is missing from this gpudiag install (looked in "
        "gpudiag/_widgets and the source tree's widgets/): reinstall gpudiag"
    )


# Past this many GPUs over several nodes, a view starts with one row per node.
NODE_VIEW_FROM_GPUS = 16
VIEW_BY_NODE = "__nodes__"
VIEW_EVERY_GPU = "__every__"


def projection_for(m: Monitor, view: str | None = None) -> Projection:
    """The rows a view shows: ``VIEW_BY_NODE``, ``VIEW_EVERY_GPU``, or a node's name; None
    picks by size (one row per node past ``NODE_VIEW_FROM_GPUS`` GPUs on several nodes)."""
    units = tuple(m.unit(s) for s in m.series)
    nodes = nodes_of(m.devices)
    if view is None:
        gpus = sum(len(v) for v in nodes.values())
        view = VIEW_BY_NODE if nodes and gpus > NODE_VIEW_FROM_GPUS else VIEW_EVERY_GPU
    if view == VIEW_BY_NODE and nodes:
        return by_node(m.devices, m.series, units)
    if view in nodes:
        return one_node(view, m.devices, m.series, units)
    if view != VIEW_EVERY_GPU:
        raise GpuDiagError(f"no node {view!r} in this monitor; nodes: {', '.join(nodes) or 'none'}")
    return every_device(m.devices, m.series, units)


def view_options(m: Monitor) -> list[tuple[str, str]]:
    """The choices of the view menu: by node, every GPU (up to a size), each node."""
    nodes = nodes_of(m.devices)
    if not nodes:
        return []
    options = [("all nodes (mean · min · max)", VIEW_BY_NODE)]
    if len(m.devices) <= EVERY_GPU_LIMIT:
        options.append(("every GPU", VIEW_EVERY_GPU))
    options += [(f"node {n} ({len(g)} GPUs)", n) for n, g in nodes.items()]
    return options


def _tiles(p: Projection) -> list[dict[str, Any]]:
    """One tile per (device, metric); lanes of a metric (CPU cores, a node's mean/min/max)
    share a tile."""
    tiles: dict[tuple[str, str], dict[str, Any]] = {}
    for i, s in enumerate(p.series):
        key = (s.device, s.metric)
        if key not in tiles:
            spec = metric_spec(s.metric, p.units[i])
            tiles[key] = {
                "id": f"{s.device}/{s.metric}",
                "device": s.device,
                "metric": s.metric,
                "label": spec.label,
                "unit": p.units[i],
                "scale_max": spec.scale_max,
                "help": f"{spec.description}. Check: {spec.check}"
                if spec.check
                else spec.description,
                "series": [],
                "lanes": [],
            }
        tiles[key]["series"].append(i)
        tiles[key]["lanes"].append(s.lane)
    return list(tiles.values())


def _metric_options(m: Monitor) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for s in m.series:
        if s.metric not in seen:
            spec = metric_spec(s.metric, m.unit(s))
            unit = f" ({spec.unit})" if spec.unit and spec.unit not in {"B", ""} else ""
            seen[s.metric] = f"{spec.label}{unit}"
    return [(label, key) for key, label in seen.items()]


def _default_metrics(m: Monitor) -> list[str]:
    present = {s.metric for s in m.series}
    host = all(d.kind == "host" for d in m.devices)
    wanted = DEFAULT_HOST_METRICS if host else DEFAULT_GPU_METRICS
    chosen = [k for k in wanted if k in present]
    return chosen or [key for _, key in _metric_options(m)][:6]


class MonitorChart(anywidget.AnyWidget):
    """Strip charts for N devices x M metrics, drawn on canvases in the browser, each with a
    value scale (0 to the tile's top, in its unit) and a time axis in seconds before now.

    Rows travel as binary columns (float64 times, float32 values) in custom messages that
    carry only rows the browser has not had; the browser redraws at most once per animation
    frame. ``spec`` describes devices, series and tiles once; ``status`` carries N/A reasons
    and throttling only when they change.
    """

    _esm = traitlets.Unicode("").tag(sync=True)
    _css = traitlets.Unicode("").tag(sync=True)
    uid = traitlets.Unicode("").tag(sync=True)
    spec = traitlets.Dict().tag(sync=True)
    status = traitlets.Dict().tag(sync=True)
    selected = traitlets.List(traitlets.Unicode()).tag(sync=True)
    window_s = traitlets.Float(60.0).tag(sync=True)
    paused = traitlets.Bool(False).tag(sync=True)
    state = traitlets.Unicode("created").tag(sync=True)

    def __init__(
        self,
        monitor: Monitor,
        *,
        push_interval_s: float = 0.25,
        view: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.monitor = monitor
        self.projection = projection_for(monitor, view)
        self.push_interval_s = float(push_interval_s)
        browser_window = min(MAX_BROWSER_WINDOW_S, monitor.history_s)
        capacity = int(np.ceil(browser_window / monitor.interval)) + 8
        capacity = min(capacity, monitor.ring.capacity)
        super().__init__(
            _esm=widget_asset("monitor.js"),
            _css=widget_asset("monitor.css"),
            uid=uuid.uuid4().hex,
            spec=self._spec(monitor, self.projection, capacity),
            selected=_default_metrics(monitor),
            window_s=min(60.0, browser_window),
            state=monitor.state,
            **kwargs,
        )
        self.capacity = capacity
        self._lock = threading.RLock()
        self._sent_seq = 0  # next ring sequence number the browser has not been sent
        self._last_push = -np.inf
        self._status_version = -1
        self.messages_sent = 0
        self.bytes_sent = 0
        self.on_msg(self._on_browser_msg)
        self._unsubscribe = monitor.subscribe(self._on_monitor)
        self._refresh_status()
        self.push(force=True)

    @staticmethod
    def _spec(m: Monitor, p: Projection, capacity: int) -> dict[str, Any]:
        return {
            "label": m.label,
            "is_recording": m.is_recording,
            "interval_s": m.interval,
            "capacity": capacity,
            "notes": [*m.notes, *([p.note] if p.note else [])],
            "view": p.name,
            "devices": [d.to_dict() for d in p.devices],
            "series": [s.to_list() for s in p.series],
            "tiles": _tiles(p),
        }

    def show(self, view: str) -> None:
        """Switch the rows shown (a node's name, ``VIEW_BY_NODE``, ``VIEW_EVERY_GPU``): the
        spec changes and the browser gets the window again in the new shape."""
        with self._lock:
            self.projection = projection_for(self.monitor, view)
            self.spec = self._spec(self.monitor, self.projection, self.capacity)
            self._status_version = -1
            self._refresh_status()
            self.backfill()

    def _rows(self, v: np.ndarray) -> np.ndarray:
        """Monitor rows -> the rows this view shows."""
        if self.projection.name == "every GPU":
            return v
        return self.projection.apply(v)

    # -- kernel -> browser -------------------------------------------------------------------
    def _send_rows(self, kind: str, first_seq: int, t: np.ndarray, v: np.ndarray) -> int:
        times = np.ascontiguousarray(t, dtype="<f8").tobytes()
        values = np.ascontiguousarray(v, dtype="<f4").tobytes()
        content = {
            "type": kind,
            "seq": int(first_seq),
            "n": int(t.shape[0]),
            "width": int(v.shape[1]),
        }
        self.send(content, buffers=[times, values])
        self.messages_sent += 1
        size = len(times) + len(values) + len(json.dumps(content))
        self.bytes_sent += size
        return size

    def push(self, *, force: bool = False) -> int:
        """Send the rows the browser has not had (at most its window); returns bytes sent.

        Nothing goes out while paused; ``force`` skips only the push-interval throttle.
        """
        with self._lock:
            if self.comm is None or self.paused:
                return 0
            now = time.monotonic()
            if not force and now - self._last_push < self.push_interval_s:
                return 0
            ring = self.monitor.ring
            if ring.count <= self._sent_seq:
                return 0
            first, t, v = ring.since(self._sent_seq, limit=self.capacity)
            self._last_push = now
            self._sent_seq = ring.count if t.size == 0 else first + t.shape[0]
            if t.size == 0:
                return 0
            return self._send_rows("rows", first, t, self._rows(v))

    def backfill(self) -> int:
        """Send the whole window again ("reset"): for a new browser view or a longer window."""
        with self._lock:
            if self.comm is None:
                return 0
            rows = int(np.ceil(self.window_s / self.monitor.interval)) + 2
            first, t, v = self.monitor.ring.since(0, limit=min(rows, self.capacity))
            self._sent_seq = max(self._sent_seq, first + t.shape[0])
            self._last_push = time.monotonic()
            return self._send_rows("reset", first, t, self._rows(v))

    def _refresh_status(self) -> None:
        m = self.monitor
        if m.status_version == self._status_version and self.state == m.state:
            return
        self._status_version = m.status_version
        p = self.projection
        events = m.throttled_since()
        throttled = {}
        for shown, members in p.devices_of(list(events)).items():
            reasons = sorted({r for d in members for r in events[d].reasons})
            since = min(events[d].since for d in members)
            throttled[shown] = {"since": since, "reasons": reasons}
        self.status = {
            "na": {str(i): reason for i, (_, reason) in p.na(m.na_index()).items()},
            "notes": {str(i): note for i, note in p.notes(m.notes_index()).items()},
            "throttled": throttled,
            "error": m.error or "",
        }
        self.state = m.state

    def _on_monitor(self, m: Monitor, event: str) -> None:
        if self.comm is None:
            return
        with self._lock:
            self._refresh_status()
            self.push(force=event == "stopped" or m.interval >= self.push_interval_s)

    # -- browser -> kernel -------------------------------------------------------------------
    def _on_browser_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "hello":
            self.backfill()

    @traitlets.observe("window_s")
    def _window_changed(self, change: dict[str, Any]) -> None:
        if getattr(self, "_lock", None) is None or change["old"] is None:
            return  # still being built
        if change["new"] > change["old"]:
            self.backfill()

    @traitlets.observe("paused")
    def _pause_changed(self, change: dict[str, Any]) -> None:
        if getattr(self, "_lock", None) is not None and not change["new"]:
            self.push(force=True)

    def close(self) -> None:
        """Close the widget and stop its monitor (no sampler outlives its widget)."""
        unsubscribe = getattr(self, "_unsubscribe", None)
        if unsubscribe is not None:
            unsubscribe()
        monitor = getattr(self, "monitor", None)
        if monitor is not None:
            monitor.stop()
        layout = getattr(self, "layout", None)
        if isinstance(layout, widgets.Widget):
            layout.close()
        super().close()


class MonitorView(TextFallback, widgets.VBox):
    """The control bar (metrics, window, pause, stop) above the strip charts.

    Closing the view stops the monitor: no sampler outlives its widget.
    """

    def fallback_text(self) -> str:
        """The monitor's status (``m.summary()`` for the figures), where widgets cannot be
        drawn."""
        return f"{self.monitor!r}\n  m.summary(), m.samples(), m.stop()"

    def fallback_html(self) -> str:
        return str(self.monitor._repr_html_())

    def __init__(self, monitor: Monitor, *, push_interval_s: float = 0.25) -> None:
        self.monitor = monitor
        self.chart = MonitorChart(monitor, push_interval_s=push_interval_s)
        self.metrics = widgets.SelectMultiple(
            options=_metric_options(monitor),
            value=tuple(self.chart.selected),
            rows=4,
            description="metrics",
            layout=widgets.Layout(width="320px"),
        )
        windows = [(label, s) for label, s in WINDOW_CHOICES_S if s <= max(30.0, monitor.history_s)]
        self.window = widgets.Dropdown(
            options=windows,
            value=min((s for _, s in windows), key=lambda s: abs(s - self.chart.window_s)),
            description="window",
            layout=widgets.Layout(width="170px"),
        )
        self.view_menu = widgets.Dropdown(
            options=view_options(monitor) or [("this machine", VIEW_EVERY_GPU)],
            value=self._current_view(),
            description="rows",
            layout=widgets.Layout(width="280px"),
        )
        self.view_menu.layout.display = None if view_options(monitor) else "none"
        self.view_menu.observe(self._view_changed, names="value")
        self.pause = widgets.ToggleButton(value=False, description="pause", icon="pause")
        self.stop_button = widgets.Button(description="stop", icon="stop", button_style="warning")
        self.status_line = widgets.HTML(value=self._status_html())
        self.metrics.observe(self._metrics_changed, names="value")
        self.window.observe(self._window_changed, names="value")
        self.pause.observe(self._pause_changed, names="value")
        self.stop_button.on_click(lambda _button: self.monitor.stop())
        self._unsubscribe = monitor.subscribe(self._on_monitor)
        self._status_version = -1
        bar = widgets.HBox(
            [
                self.metrics,
                widgets.VBox(
                    [self.window, self.view_menu, widgets.HBox([self.pause, self.stop_button])]
                ),
                self.status_line,
            ],
            layout=widgets.Layout(align_items="flex-start", flex_flow="row wrap"),
        )
        self.bar = bar
        super().__init__([bar, self.chart])
        self.add_class("gpudiag-monitor-view")

    def _status_html(self) -> str:
        m = self.monitor
        stats = m.stats()
        kind = "recording" if m.is_recording else "live"
        text = f"<b>{html.escape(m.state)}</b> · {html.escape(m.label)} ({kind}) · "
        text += f"every {m.interval:g} s · {int(stats['ticks'])} ticks"
        if stats["missed_ticks"]:
            text += f" · {int(stats['missed_ticks'])} late"
        if m.error:
            text += f"<br><span style='color:#c0392b'>error: {html.escape(m.error)}</span>"
        return f"<div style='font-size:12px;line-height:1.4;padding:2px 8px'>{text}</div>"

    def _on_monitor(self, m: Monitor, event: str) -> None:
        # The tick count changes every tick; refresh the line about once per second.
        if event == "stopped" or m.stats()["ticks"] % max(1, round(1.0 / m.interval)) == 0:
            self.status_line.value = self._status_html()
        if event == "stopped":
            self.stop_button.disabled = True
            self.pause.disabled = True

    def _current_view(self) -> str:
        name = self.chart.projection.name
        return {"by node": VIEW_BY_NODE, "every GPU": VIEW_EVERY_GPU}.get(name, name)

    def _view_changed(self, change: dict[str, Any]) -> None:
        self.chart.show(str(change["new"]))

    def _metrics_changed(self, change: dict[str, Any]) -> None:
        self.chart.selected = list(change["new"])

    def _window_changed(self, change: dict[str, Any]) -> None:
        self.chart.window_s = float(change["new"])

    def _pause_changed(self, change: dict[str, Any]) -> None:
        self.chart.paused = bool(change["new"])
        self.pause.description = "resume" if change["new"] else "pause"
        self.pause.icon = "play" if change["new"] else "pause"

    def close(self) -> None:
        unsubscribe = getattr(self, "_unsubscribe", None)
        if unsubscribe is not None:
            unsubscribe()
        monitor = getattr(self, "monitor", None)
        if monitor is not None:
            monitor.stop()
        for child in list(self.children):
            _close_tree(child)
        if isinstance(self.layout, widgets.Widget):
            self.layout.close()
        super().close()


def _close_tree(widget: widgets.Widget) -> None:
    """Close a widget, every widget inside it, and their layout and style widgets: closing a
    Box closes neither its children nor anyone's layout, and each holds a comm open."""
    for child in list(getattr(widget, "children", ())):
        _close_tree(child)
    for part in ("layout", "style"):
        inner = getattr(widget, part, None)
        if isinstance(inner, widgets.Widget):
            inner.close()
    widget.close()


__all__ = [
    "VIEW_BY_NODE",
    "VIEW_EVERY_GPU",
    "MonitorChart",
    "MonitorView",
    "projection_for",
    "view_options",
    "widget_asset",
]
