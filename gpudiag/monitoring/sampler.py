"""The background sampler: one thread per kernel reading a feed into bounded ring buffers."""

from __future__ import annotations

import atexit
import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpudiag import _views
from gpudiag._report import jsonable
from gpudiag._views import Block, Card, Carded, Grid, Lines
from gpudiag.errors import GpuDiagError
from gpudiag.monitoring.buffer import SeriesRing
from gpudiag.monitoring.feeds import Feed, Frame, NaMap
from gpudiag.monitoring.metrics import (
    FLAG_METRICS,
    DeviceSpec,
    SeriesKey,
    metric_label,
    metric_spec,
)
from gpudiag.probe.readings import Status

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("gpudiag.monitoring")

MAX_CAPACITY = 2_000_000
# The ring's memory, whatever the width: 512 GPUs x 24 metrics keep 10 min at 1 s in 59 MB.
MAX_BUFFER_BYTES = 256 << 20
# History read at start from a source that keeps it (Prometheus), at most this far back.
BACKFILL_S = 300.0
MAX_CHANGES = 256  # N/A-reason, note and throttling states kept for save()
# ... and fewer for a wide feed: each state is a copy of up to one reason per series.
MAX_CHANGE_ENTRIES = 500_000
Listener = Callable[["Monitor", str], None]


def format_value(value: float, unit: str) -> str:
    """A number with its unit, scaled for reading (bytes to GiB, B/s to GB/s); N/A for NaN."""
    if value is None or not math.isfinite(value):
        return "N/A"
    if unit == "B":
        for scale, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {name}"
        return f"{value:.0f} B"
    if unit == "B/s":
        for rate, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= rate:
                return f"{value / rate:.2f} {name}"
        return f"{value:.0f} B/s"
    if unit in {"%", "W", "°C", "GB/s"}:
        return f"{value:.1f} {unit}"
    if unit == "MHz":
        return f"{value:.0f} MHz"
    return f"{value:.4g}" + (f" {unit}" if unit else "")


def next_slot(previous_t: float, now: float, interval: float) -> tuple[float, int]:
    """When the next tick is due after one due at ``previous_t``, and how many were missed.

    Ticks stay on the ``previous_t + k * interval`` grid. After a slow read the missed
    slots are skipped rather than run in a burst, so a stall never turns into a spike.
    """
    due = previous_t + interval
    if now <= due:
        return due, 0
    missed = math.floor((now - due) / interval) + 1
    return due + missed * interval, missed


@dataclass(frozen=True, slots=True)
class ThrottleEvent:
    """A stretch of time a device's clocks were held down, and why."""

    device: str
    reasons: tuple[str, ...]
    since: float  # seconds since the epoch
    until: float | None = None  # None: still throttled

    @property
    def duration_s(self) -> float | None:
        return None if self.until is None else self.until - self.since

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "reasons": list(self.reasons),
            "since": self.since,
            "until": self.until,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True, slots=True)
class SummaryRow:
    device: str
    metric: str
    lane: str
    unit: str
    samples: int
    na_samples: int
    mean: float
    p5: float
    p50: float
    p95: float
    max: float
    last: float
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.metric}[{self.lane}]" if self.lane else self.metric


@dataclass(frozen=True, slots=True)
class MonitorSummary(Carded):
    """Percentiles per series over what the monitor holds, plus the throttling it saw."""

    label: str
    is_recording: bool
    interval_s: float
    duration_s: float
    ticks: int
    rows: tuple[SummaryRow, ...]
    throttle_events: tuple[ThrottleEvent, ...] = ()

    def row(self, device: str, metric: str, lane: str = "") -> SummaryRow:
        for r in self.rows:
            if r.device == device and r.metric == metric and r.lane == lane:
                return r
        raise GpuDiagError(
            f"no series {device}/{metric} in this summary; known devices: "
            + ", ".join(sorted({r.device for r in self.rows}))
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "is_recording": self.is_recording,
            "interval_s": self.interval_s,
            "duration_s": self.duration_s,
            "ticks": self.ticks,
            "rows": [jsonable(r) for r in self.rows],
            "throttle_events": [e.to_dict() for e in self.throttle_events],
        }

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([jsonable(r) for r in self.rows])

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.device for r in self.rows))

    def valued_rows(self) -> tuple[SummaryRow, ...]:
        """Rows with at least one value (what the summary table shows)."""
        return tuple(r for r in self.rows if r.samples > r.na_samples)

    def not_recorded(self) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """Series that never had a value, grouped: (reason, metric labels, devices).

        Devices that miss the same metrics for the same reason share one entry (a DCGM field
        name and a scrape's file name are dropped from the reason so that they can); devices
        are empty when every device of the summary is in it.
        """
        per_device: dict[tuple[str, str], dict[str, None]] = {}
        for r in self.rows:
            if r.samples > r.na_samples:
                continue
            reason = r.reason or "no value recorded"
            for pattern, replacement in _REASON_VARIANTS:
                reason = pattern.sub(replacement, reason)
            per_device.setdefault((r.device, reason), {})[metric_spec(r.metric, r.unit).label] = (
                None
            )
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for (device, reason), labels in per_device.items():
            groups.setdefault((reason, tuple(labels)), []).append(device)
        every = set(self.devices)
        return [
            (reason, labels, () if set(devices) == every else tuple(devices))
            for (reason, labels), devices in groups.items()
        ]

    def _cell(self, r: SummaryRow, value: float) -> str:
        if r.metric in FLAG_METRICS and math.isfinite(value):
            return "yes" if value >= 0.5 else "no"
        return format_value(value, r.unit)

    def _note(self, r: SummaryRow) -> str:
        return f"N/A in {r.na_samples} of {r.samples} samples" if r.na_samples else ""

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """One device: percentiles per metric. Several: the median of each metric per device
        (a flag: yes when it was ever set), so the table stays one row per metric."""
        rows = self.valued_rows()
        devices = tuple(dict.fromkeys(r.device for r in rows))
        if len(devices) <= 1:
            header = ["metric", "p5", "p50", "p95", "max", "last", "note"]
            return header, [
                [
                    metric_label(r.metric, r.unit, r.lane),
                    *(self._cell(r, v) for v in (r.p5, r.p50, r.p95, r.max, r.last)),
                    self._note(r),
                ]
                for r in rows
            ]
        by_name: dict[str, dict[str, str]] = {}
        for r in rows:
            shown = r.max if r.metric in FLAG_METRICS else r.p50
            cell = self._cell(r, shown) + (" *" if r.na_samples else "")
            by_name.setdefault(metric_label(r.metric, r.unit, r.lane), {})[r.device] = cell
        return ["metric (median)", *devices], [
            [name, *(cells.get(d, "") for d in devices)] for name, cells in by_name.items()
        ]

    def _footnotes(self) -> list[str]:
        lines = []
        if len({r.device for r in self.valued_rows()}) > 1:
            lines.append(
                "median over the run per device (a flag: yes if ever set); * some samples N/A; "
                "every percentile: .to_pandas()"
            )
        for reason, labels, devices in self.not_recorded():
            where = f" on {', '.join(devices)}" if devices else ""
            lines.append(f"not recorded{where}: {', '.join(labels)} ({reason})")
        return lines

    def _title(self) -> str:
        kind = " (recording)" if self.is_recording else ""
        return (
            f"Monitor summary: {self.label}{kind}, {self.ticks} ticks over "
            f"{self.duration_s:.1f} s at {self.interval_s:g} s"
        )

    def as_card(self) -> Card:
        header, rows = self._table()
        table = Grid(header, rows) if rows else Lines(["no metric had a value"])
        blocks: list[Block] = [table, Lines(self._footnotes(), "note")]
        if self.throttle_events:
            events = Grid(
                ["device", "throttled since", "for", "reasons"],
                [
                    [
                        e.device,
                        time.strftime("%H:%M:%S", time.localtime(e.since)),
                        "ongoing" if e.duration_s is None else f"{e.duration_s:.1f} s",
                        ", ".join(e.reasons),
                    ]
                    for e in self.throttle_events
                ],
            )
            blocks += [Lines(["Throttling"], "heading"), events]
        return Card(self._title(), blocks)

    def __repr__(self) -> str:
        lines = [self._title()]
        header, rows = self._table()
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
        for row in (header, *rows):
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        lines = [line.rstrip() for line in lines]
        lines.extend(self._footnotes())
        for e in self.throttle_events:
            lasting = "ongoing" if e.duration_s is None else f"{e.duration_s:.1f} s"
            lines.append(f"throttled: {e.device} {', '.join(e.reasons)} ({lasting})")
        return "\n".join(lines)


# Parts of an N/A reason that name one field or one file: dropped so that reasons group.
_REASON_VARIANTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bDCGM_FI_[A-Z0-9_]+ is not exported"), "not exported"),
    (re.compile(r"by the recorded scrape \S+?\.prom"), "by the recorded dcgm-exporter scrape"),
)


# -- one monitor per kernel ----------------------------------------------------------------

_ACTIVE: Monitor | None = None
_ACTIVE_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def active() -> Monitor | None:
    """The running monitor of this process, if any."""
    return _ACTIVE


def _register(m: Monitor) -> Monitor | None:
    global _ACTIVE, _ATEXIT_REGISTERED
    with _ACTIVE_LOCK:
        previous, _ACTIVE = _ACTIVE, m
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_at_exit)
            _ATEXIT_REGISTERED = True
    return previous if previous is not m else None


def _unregister(m: Monitor) -> None:
    global _ACTIVE
    with _ACTIVE_LOCK:
        if _ACTIVE is m:
            _ACTIVE = None


def _stop_at_exit() -> None:
    m = _ACTIVE
    if m is not None:
        m.stop()


def stop_active() -> bool:
    """Stop the running monitor; False when none was running."""
    m = _ACTIVE
    if m is None:
        return False
    m.stop()
    return True


class Monitor(Carded):
    """Samples a feed every ``interval`` seconds on a background thread.

    Memory is bounded: ``history_s`` of rows are kept (a ring), whatever the run length.
    ``stop()`` is idempotent and also runs at interpreter exit, when the widget closes, and
    when the sampler raises (``error`` then says what happened). Only one monitor samples
    per process: starting another stops this one.

    Tests and tools can build one with ``start=False`` and call ``tick()`` themselves, with
    an injected ``clock``.
    """

    def __init__(
        self,
        feed: Feed,
        *,
        interval: float = 0.1,
        history_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        if not isinstance(interval, (int, float)) or not math.isfinite(interval) or interval <= 0:
            raise GpuDiagError(f"interval must be a positive number of seconds, not {interval!r}")
        if not math.isfinite(history_s) or history_s <= 0:
            raise GpuDiagError(f"history_s must be a positive number of seconds, not {history_s!r}")
        self.feed = feed
        self.interval = float(interval)
        self.history_s = float(history_s)
        capacity = int(min(MAX_CAPACITY, max(16, math.ceil(history_s / interval) + 1)))
        row_bytes = 8 * (len(feed.series) + 1)
        self._extra_notes: list[str] = []
        if capacity * row_bytes > MAX_BUFFER_BYTES:
            capacity = max(16, MAX_BUFFER_BYTES // row_bytes)
            self._extra_notes.append(
                f"history kept: {capacity * interval:.0f} s ({len(feed.series)} series fill the "
                f"{MAX_BUFFER_BYTES >> 20} MiB buffer), not the {history_s:g} s asked"
            )
        self._ring = SeriesRing(capacity, len(feed.series))
        self._clock = clock
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = "created"
        self._closed = False
        self.error: str | None = None
        self._listeners: list[Listener] = []
        self._listener_failures: set[int] = set()
        # Current N/A reasons, notes and throttling, plus their change points (bounded).
        self._na: NaMap = {}
        self._notes: dict[int, str] = {}
        self._events: dict[str, tuple[str, ...]] = {}
        # Bounded: a wide feed whose reasons flap (a cluster's scrapes failing here and
        # there) must not keep a copy per tick of thousands of reasons.
        keep = max(16, min(MAX_CHANGES, MAX_CHANGE_ENTRIES // max(1, len(feed.series))))
        self._na_changes: deque[tuple[int, NaMap]] = deque(maxlen=keep)
        self._note_changes: deque[tuple[int, dict[int, str]]] = deque(maxlen=keep)
        self._event_changes: deque[tuple[int, dict[str, tuple[str, ...]]]] = deque(maxlen=keep)
        self._throttle_open: dict[str, ThrottleEvent] = {}
        self._throttle_log: deque[ThrottleEvent] = deque(maxlen=512)
        self.status_version = 0  # bumps when N/A reasons, notes or throttling change
        self._tick_count = 0
        self._tick_total_s = 0.0
        self._tick_max_s = 0.0
        self.missed_ticks = 0
        self._thread_cpu_s = 0.0  # CPU time the sampler thread used (time.thread_time)
        self.started_at: float | None = None
        self._series_index = {s: i for i, s in enumerate(feed.series)}
        self._view: Any | None = None
        self.displayed_in: int | None = None  # IPython execution count that showed the view
        if start:
            self.start()

    # -- what is being watched ---------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.feed.label

    @property
    def is_recording(self) -> bool:
        return bool(self.feed.is_recording)

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        return self.feed.devices

    @property
    def series(self) -> tuple[SeriesKey, ...]:
        return self.feed.series

    @property
    def notes(self) -> tuple[str, ...]:
        return (*self.feed.notes, *self._extra_notes)

    @property
    def ring(self) -> SeriesRing:
        return self._ring

    @property
    def state(self) -> str:
        """One of: created, running, stopped, finished (a recording ended), error."""
        return self._state

    @property
    def running(self) -> bool:
        return self._state == "running"

    def unit(self, series: SeriesKey) -> str:
        units = getattr(self.feed, "units", None)
        if units:
            return str(units[self._series_index[series]])
        return metric_spec(series.metric).unit

    def na_reasons(self) -> dict[SeriesKey, tuple[Status, str]]:
        """Series that are N/A now, with the status and reason."""
        with self._lock:
            return {self.series[i]: v for i, v in self._na.items()}

    def notes_by_series(self) -> dict[SeriesKey, str]:
        with self._lock:
            return {self.series[i]: v for i, v in self._notes.items()}

    def na_index(self) -> dict[int, tuple[Status, str]]:
        with self._lock:
            return dict(self._na)

    def notes_index(self) -> dict[int, str]:
        with self._lock:
            return dict(self._notes)

    # -- listeners (the widget) ----------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(monitor, event)`` after each tick ("tick") and once when sampling
        ends ("stopped"). Runs on the sampler thread: keep it short. Returns an unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _notify(self, event: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(self, event)
            except Exception:  # a broken view must not stop sampling
                if id(listener) not in self._listener_failures:
                    self._listener_failures.add(id(listener))
                    log.exception("gpudiag monitor: a listener failed (logged once)")

    # -- sampling --------------------------------------------------------------------------------
    def tick(self) -> Frame:
        """Read the feed once and store the row (the sampler thread calls this)."""
        started = self._clock()
        frame = self.feed.read()
        self._record(frame, started)
        self._notify("tick")
        return frame

    def backfill(self) -> int:
        """Store the rows a feed can read from before the start (Prometheus's history), up
        to ``BACKFILL_S`` and the buffer; returns how many. The sampler thread calls it once
        before its first tick, so a slow answer never holds up the caller."""
        read = getattr(self.feed, "history", None)  # only feeds whose source keeps history
        if read is None or self._ring.count:
            return 0
        span = min(BACKFILL_S, self.history_s, (self._ring.capacity - 1) * self.interval)
        frames, note = read(span, self.interval)
        for frame in frames:
            self._record(frame, self._clock())
        if note:
            with self._lock:
                self._extra_notes.append(note)
                self.status_version += 1
        if frames:
            self._notify("tick")
        return len(frames)

    def _record(self, frame: Frame, started: float) -> None:
        seq = self._ring.append(frame.timestamp, frame.values)
        with self._lock:
            changed = False
            if frame.na != self._na:
                self._na = dict(frame.na)
                self._na_changes.append((seq, self._na))
                changed = True
            if frame.notes != self._notes:
                self._notes = dict(frame.notes)
                self._note_changes.append((seq, self._notes))
                changed = True
            if frame.events != self._events:
                self._update_throttling(frame.events, frame.timestamp)
                self._events = dict(frame.events)
                self._event_changes.append((seq, self._events))
                changed = True
            self._prune_changes()
            if changed:
                self.status_version += 1
            elapsed = self._clock() - started
            self._tick_count += 1
            self._tick_total_s += elapsed
            self._tick_max_s = max(self._tick_max_s, elapsed)

    def _prune_changes(self) -> None:
        oldest = self._ring.oldest
        # Keep the last change at or before the oldest held row: it still applies to it.
        for changes in (self._na_changes, self._event_changes, self._note_changes):
            while len(changes) > 1 and changes[1][0] <= oldest:
                changes.popleft()

    def _update_throttling(self, events: dict[str, tuple[str, ...]], now: float) -> None:
        for device, reasons in events.items():
            current = self._throttle_open.get(device)
            if current is None or current.reasons != reasons:
                if current is not None:
                    self._throttle_log.append(
                        ThrottleEvent(device, current.reasons, current.since, now)
                    )
                self._throttle_open[device] = ThrottleEvent(device, reasons, now)
        for device in list(self._throttle_open):
            if device not in events:
                current = self._throttle_open.pop(device)
                self._throttle_log.append(
                    ThrottleEvent(device, current.reasons, current.since, now)
                )

    def throttled_since(self) -> dict[str, ThrottleEvent]:
        """Devices throttled right now, with the time it started and the reasons."""
        with self._lock:
            return dict(self._throttle_open)

    def throttle_events(self) -> tuple[ThrottleEvent, ...]:
        """Throttling seen so far (the last 512 stretches), ongoing ones last."""
        with self._lock:
            return tuple(self._throttle_log) + tuple(self._throttle_open.values())

    def start(self) -> Monitor:
        """Start the sampler thread (stopping any other monitor of this process)."""
        with self._lock:
            if self._state == "running":
                return self
            if self._closed:
                raise GpuDiagError("this monitor was stopped; start a new one with gd.monitor()")
            self._state = "running"
            self.started_at = time.time()
        previous = _register(self)
        if previous is not None:
            previous.close()
        self._thread = threading.Thread(target=self._run, name="gpudiag-monitor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        cpu_start = time.thread_time()
        try:
            self.backfill()
            next_t = self._clock()
            while not self._stop_event.is_set():
                frame = self.tick()
                if frame.finished:
                    self._finish("finished")
                    return
                now = self._clock()
                next_t, missed = next_slot(next_t, now, self.interval)
                self.missed_ticks += missed
                if self._stop_event.wait(next_t - now):
                    return
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("gpudiag monitor: the sampler stopped on an error")
            self._finish("error")
        finally:
            self._thread_cpu_s = time.thread_time() - cpu_start

    def stop(self) -> None:
        """Stop sampling and release the feed. Safe to call any number of times, any thread."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 3 * self.interval))
            if thread.is_alive():
                log.warning("gpudiag monitor: the sampler did not stop within the timeout")
        self._finish("stopped")

    def close(self) -> None:
        """``stop()`` and close the widget, if one was shown."""
        self.stop()
        view = self._view
        self._view = None
        if view is not None:
            view.close()

    def _finish(self, state: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_event.set()
            self._state = state if self._state in {"running", "created"} else self._state
            now = time.time()
            for device in list(self._throttle_open):
                ev = self._throttle_open.pop(device)
                self._throttle_log.append(ThrottleEvent(device, ev.reasons, ev.since, now))
        try:
            self.feed.close()
        except Exception:
            log.exception("gpudiag monitor: closing the feed failed")
        _unregister(self)
        self._notify("stopped")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results -----------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Sampler health: ticks, mean and max wall time of one tick, ticks skipped for being
        late, and (once the thread has ended) the CPU time the sampler thread used."""
        with self._lock:
            n = self._tick_count
            return {
                "ticks": float(n),
                "mean_tick_ms": 1e3 * self._tick_total_s / n if n else math.nan,
                "max_tick_ms": 1e3 * self._tick_max_s,
                "missed_ticks": float(self.missed_ticks),
                "sampler_cpu_s": self._thread_cpu_s,
                "buffer_rows": float(len(self._ring)),
                "buffer_bytes": float(self._ring.nbytes),
            }

    def samples(self, last_s: float | None = None) -> pd.DataFrame:
        """The buffered rows as a DataFrame: a UTC time index, columns (device, metric).

        N/A values are NaN (``na_reasons()`` says why). ``df.attrs`` holds the label, the
        interval, whether it is a recording, and the unit of each column.
        """
        import pandas as pd

        t, v = self._ring.last()
        if last_s is not None and t.size:
            keep = t >= t[-1] - float(last_s)
            t, v = t[keep], v[keep]
        columns = pd.MultiIndex.from_tuples(
            [(s.device, s.name) for s in self.series], names=["device", "metric"]
        )
        index = pd.DatetimeIndex(pd.to_datetime(t, unit="s", utc=True), name="time")
        df = pd.DataFrame(v, index=index, columns=columns)
        df.attrs.update(
            {
                "label": self.label,
                "is_recording": self.is_recording,
                "interval_s": self.interval,
                "units": {f"{s.device}/{s.name}": self.unit(s) for s in self.series},
                "hosts": {d.id: d.host for d in self.devices if d.host},
            }
        )
        return df

    def summary(self) -> MonitorSummary:
        """p5/p50/p95/max/last per series over the buffered rows, and the throttling seen."""
        t, v = self._ring.last()
        na = self.na_index()
        rows = []
        for i, s in enumerate(self.series):
            col = v[:, i] if v.size else np.empty(0)
            good = col[np.isfinite(col)]
            if good.size:
                p5, p50, p95 = (float(x) for x in np.percentile(good, [5, 50, 95]))
                mean, mx = float(good.mean()), float(good.max())
            else:
                p5 = p50 = p95 = mean = mx = math.nan
            last = float(col[-1]) if col.size else math.nan
            rows.append(
                SummaryRow(
                    device=s.device,
                    metric=s.metric,
                    lane=s.lane,
                    unit=self.unit(s),
                    samples=int(col.size),
                    na_samples=int(col.size - good.size),
                    mean=mean,
                    p5=p5,
                    p50=p50,
                    p95=p95,
                    max=mx,
                    last=last,
                    reason=na[i][1] if i in na else "",
                )
            )
        duration = float(t[-1] - t[0]) if t.size > 1 else 0.0
        return MonitorSummary(
            label=self.label,
            is_recording=self.is_recording,
            interval_s=self.interval,
            duration_s=duration,
            ticks=int(t.size),
            rows=tuple(rows),
            throttle_events=self.throttle_events(),
        )

    def save(
        self,
        path: str | Path,
        *,
        label: str | None = None,
        recording: str = "",
        notice: str = "",
        started_at: str | None = None,
    ) -> Path:
        """Write the buffered rows as a session (JSON lines) that ``replay=`` plays back."""
        from gpudiag.probe.session_replay import (
            SESSION_FORMAT,
            SESSION_VERSION,
            SessionHeader,
            write_session,
        )

        first_seq, t, v = self._ring.since(0)
        with self._lock:
            na_changes = list(self._na_changes)
            event_changes = list(self._event_changes)
            note_changes = list(self._note_changes)
        header = SessionHeader(
            format=SESSION_FORMAT,
            version=SESSION_VERSION,
            label=label or self.label,
            recording=recording
            or f"recorded by gpudiag's monitor from {self.label} at {self.interval:g} s",
            interval_s=self.interval,
            devices=[d.to_dict() for d in self.devices],
            series=[s.to_list() for s in self.series],
            units=[self.unit(s) for s in self.series],
            notice=notice,
            started_at=started_at
            if started_at is not None
            else (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(t[0]))) if t.size else ""),
        )

        def state_at(changes: list[tuple[int, Any]], seq: int) -> Any:
            current: Any = {}
            for at, value in changes:
                if at > seq:
                    break
                current = value
            return current

        def ticks() -> Any:
            t0 = float(t[0]) if t.size else 0.0
            for k in range(t.size):
                seq = first_seq + k
                yield (
                    float(t[k]) - t0,
                    v[k],
                    state_at(na_changes, seq),
                    state_at(event_changes, seq),
                    state_at(note_changes, seq),
                )

        return write_session(path, header, ticks())

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "is_recording": self.is_recording,
            "state": self.state,
            "error": self.error,
            "interval_s": self.interval,
            "history_s": self.history_s,
            "notes": list(self.notes),
            "devices": [d.to_dict() for d in self.devices],
            "series": [s.to_list() for s in self.series],
            "stats": jsonable(self.stats()),
            "na": {
                f"{s.device}/{s.name}": [st.value, r] for s, (st, r) in self.na_reasons().items()
            },
        }

    def status_line(self) -> str:
        kind = "recording" if self.is_recording else "live"
        devices = ", ".join(d.label for d in self.devices)
        text = f"{self.state}: {self.label} ({kind}), every {self.interval:g} s: {devices}"
        if self.error:
            text += f"; error: {self.error}"
        return text

    def as_card(self) -> Card:
        ticks = int(self.stats()["ticks"])
        return Card(
            "gpudiag monitor",
            [
                Lines([self.status_line()]),
                Lines(self.notes, "note"),
                Lines([f"{ticks} ticks; m.samples(), m.summary(), m.stop()"], "note"),
            ],
        )

    def __repr__(self) -> str:
        return f"<Monitor {self.status_line()}>"

    # -- the widget (presentation, loaded on use) ----------------------------------------------
    def view(self) -> Any:
        """The live widget (an ipywidgets box: control bar + charts), created on first use."""
        if self._view is None:
            # The widget is registered by gpudiag.ui (the measurement layer never imports it).
            self._view = _views.build("widget", self)
        return self._view

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        count = getattr(shell, "execution_count", None)
        if count is not None and count == self.displayed_in:
            return  # ``gd.monitor()`` already showed the widget in this cell
        self.displayed_in = count
        display(self.view())


__all__ = [
    "Monitor",
    "MonitorSummary",
    "SummaryRow",
    "ThrottleEvent",
    "active",
    "format_value",
    "next_slot",
    "stop_active",
]
