"""A recorded monitoring session (JSON lines) and its playback at real speed.

File format ``gpudiag.session`` version 1, one JSON object per line:

* line 1, the header: ``{"format": "gpudiag.session", "version": 1, "label": ...,
  "recording": <where the data comes from>, "interval_s": ..., "devices": [{"id", "label",
  "kind", "name", "uuid", "host", "facts"}], "series": [[device, metric] or [device, metric,
  lane], ...], "units": [...]}``;
* then one line per tick: ``{"t": seconds since the first tick, "v": [one number or null
  per series]}``. A tick may carry ``"na": {"<series index>": [status, reason]}``, the N/A
  reasons from this tick on (it replaces the previous map), and ``"events": {"<device>":
  [clock-event reason, ...]}``, the active clock-event reasons from this tick on, and
  ``"notes": {"<series index>": note}``, how values were obtained (e.g. a rough estimate).

A null value is N/A; its reason is the one the last ``"na"`` map gave for that series.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpudiag._files import SESSION_BYTES, read_bytes
from gpudiag.errors import ArgumentError, ReplayError
from gpudiag.probe.readings import Status

SESSION_FORMAT = "gpudiag.session"
SESSION_VERSION = 1
SUFFIXES = (".jsonl", ".ndjson")


class SessionHeader(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    version: int
    label: str
    recording: str
    interval_s: float
    devices: list[dict[str, Any]]
    series: list[list[str]]
    units: list[str] = []
    notice: str = ""
    started_at: str = ""


class SessionTick(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    t: float
    v: list[float | None]
    na: dict[str, tuple[str, str]] | None = None
    events: dict[str, list[str]] | None = None
    notes: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ReplayFrame:
    """The recorded state current at one moment of playback."""

    timestamp: float  # wall-clock time of this read (the recording is replayed "now")
    index: int  # which recorded tick
    recorded_t: float  # its time in the recording, seconds from the first tick
    values: np.ndarray  # float64, NaN where N/A
    na: dict[int, tuple[Status, str]]
    events: dict[str, tuple[str, ...]]
    notes: dict[int, str]
    finished: bool = False


class SessionRecording:
    """A whole recording in memory: the header and columnar arrays of its ticks."""

    def __init__(
        self,
        header: SessionHeader,
        t: np.ndarray,
        values: np.ndarray,
        na_changes: list[tuple[int, dict[int, tuple[Status, str]]]],
        event_changes: list[tuple[int, dict[str, tuple[str, ...]]]],
        note_changes: list[tuple[int, dict[int, str]]] | None = None,
        *,
        source: str = "",
    ) -> None:
        self.header = header
        self.t = t
        self.values = values
        self._na_at = [i for i, _ in na_changes]
        self._na = [m for _, m in na_changes]
        self._events_at = [i for i, _ in event_changes]
        self._events = [m for _, m in event_changes]
        self._notes_at = [i for i, _ in note_changes or []]
        self._notes = [m for _, m in note_changes or []]
        self.source = source

    @property
    def label(self) -> str:
        return self.header.label

    @property
    def tick_count(self) -> int:
        return int(self.t.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.t[-1]) if self.tick_count else 0.0

    def na_at(self, index: int) -> dict[int, tuple[Status, str]]:
        pos = bisect.bisect_right(self._na_at, index) - 1
        return self._na[pos] if pos >= 0 else {}

    def events_at(self, index: int) -> dict[str, tuple[str, ...]]:
        pos = bisect.bisect_right(self._events_at, index) - 1
        return self._events[pos] if pos >= 0 else {}

    def notes_at(self, index: int) -> dict[int, str]:
        pos = bisect.bisect_right(self._notes_at, index) - 1
        return self._notes[pos] if pos >= 0 else {}

    def index_at(self, elapsed_s: float) -> int:
        """The tick current ``elapsed_s`` into the recording (the last one not after it)."""
        return max(0, int(np.searchsorted(self.t, elapsed_s, side="right")) - 1)

    @classmethod
    def load(cls, path: str | Path) -> SessionRecording:
        p = Path(path)
        data = read_bytes(p, "monitor recording", max_bytes=SESSION_BYTES, error=ReplayError)
        return cls.from_bytes(data, source=p.name)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "recording") -> SessionRecording:
        lines = [line for line in data.splitlines() if line.strip()]
        if not lines:
            raise ReplayError(f"{source} is empty: expected a gpudiag session (JSON lines)")
        try:
            header = msgspec.json.decode(lines[0], type=SessionHeader)
        except msgspec.ValidationError as exc:
            raise ReplayError(f"{source}: the first line is not a session header ({exc})") from None
        except msgspec.DecodeError as exc:
            raise ReplayError(f"{source}: the first line is not JSON ({exc})") from None
        if header.format != SESSION_FORMAT:
            raise ReplayError(
                f"{source} is not a gpudiag session (format {header.format!r}, expected "
                f"{SESSION_FORMAT!r}); record one with Monitor.save(path)"
            )
        if header.version != SESSION_VERSION:
            raise ReplayError(
                f"{source} is session version {header.version}; this gpudiag reads version "
                f"{SESSION_VERSION}: upgrade gpudiag"
            )
        width = len(header.series)
        decoder = msgspec.json.Decoder(SessionTick)
        t = np.empty(len(lines) - 1, dtype=np.float64)
        values = np.full((len(lines) - 1, width), np.nan, dtype=np.float64)
        na_changes: list[tuple[int, dict[int, tuple[Status, str]]]] = []
        event_changes: list[tuple[int, dict[str, tuple[str, ...]]]] = []
        note_changes: list[tuple[int, dict[int, str]]] = []
        for i, line in enumerate(lines[1:]):
            try:
                tick = decoder.decode(line)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise ReplayError(f"{source}: tick line {i + 2} is malformed ({exc})") from None
            if len(tick.v) != width:
                raise ReplayError(
                    f"{source}: tick line {i + 2} has {len(tick.v)} values for {width} series"
                )
            t[i] = tick.t
            values[i] = [math.nan if v is None else v for v in tick.v]
            if tick.na is not None:
                try:
                    na_map = {int(k): (Status(s), r) for k, (s, r) in tick.na.items()}
                except ValueError as exc:
                    raise ReplayError(
                        f"{source}: tick line {i + 2}: bad N/A entry ({exc})"
                    ) from None
                na_changes.append((i, na_map))
            if tick.events is not None:
                event_changes.append((i, {d: tuple(r) for d, r in tick.events.items()}))
            if tick.notes is not None:
                try:
                    note_changes.append((i, {int(k): str(n) for k, n in tick.notes.items()}))
                except ValueError as exc:
                    raise ReplayError(f"{source}: tick line {i + 2}: bad note ({exc})") from None
        if t.size and np.any(np.diff(t) < 0):
            raise ReplayError(f"{source}: tick times go backwards")
        return cls(header, t, values, na_changes, event_changes, note_changes, source=source)


def write_session(
    path: str | Path,
    header: SessionHeader,
    ticks: Iterable[
        tuple[
            float,
            Sequence[float],
            dict[int, tuple[Status, str]],
            dict[str, tuple[str, ...]],
            dict[int, str],
        ]
    ],
) -> Path:
    """Write a session: ``ticks`` yields (t, values, N/A reasons, clock-event reasons, notes).

    The three maps are written only when they change, so long sessions stay small.
    """
    p = Path(path)
    encoder = msgspec.json.Encoder()
    last_na: dict[int, tuple[Status, str]] | None = None
    last_events: dict[str, tuple[str, ...]] | None = None
    last_notes: dict[int, str] | None = None
    with p.open("wb") as out:
        out.write(encoder.encode(header))
        out.write(b"\n")
        for t, values, na_map, events, notes in ticks:
            tick = SessionTick(
                t=round(float(t), 6),
                v=[None if not math.isfinite(v) else float(v) for v in values],
            )
            if na_map != last_na:
                tick.na = {str(k): (s.value, r) for k, (s, r) in sorted(na_map.items())}
                last_na = dict(na_map)
            if events != last_events:
                tick.events = {d: list(r) for d, r in sorted(events.items())}
                last_events = dict(events)
            if notes != last_notes:
                tick.notes = {str(k): n for k, n in sorted(notes.items())}
                last_notes = dict(notes)
            out.write(encoder.encode(tick))
            out.write(b"\n")
    return p


class SessionReplay:
    """Plays a recording at real speed: ``read()`` returns the tick current now.

    With ``loop`` (the default) playback starts over after the last tick, so a demo never
    runs dry; without it, ``read()`` keeps the last tick and marks the frame ``finished``.
    """

    is_recording = True

    def __init__(
        self,
        recording: SessionRecording,
        *,
        loop: bool = True,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if speed <= 0:
            raise ArgumentError("speed must be positive (1.0 is real time)")
        self.recording = recording
        self.loop = loop
        self.speed = speed
        self._clock = clock
        self._wall = wall_clock
        self._start: float | None = None
        self.label = f"recording: {recording.label}"

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> SessionReplay:
        return cls(SessionRecording.load(path), **kwargs)

    def read(self) -> ReplayFrame:
        now = self._clock()
        if self._start is None:
            self._start = now
        rec = self.recording
        elapsed = (now - self._start) * self.speed
        # One tick past the last keeps the last tick on screen for one interval.
        period = rec.duration_s + rec.header.interval_s
        finished = False
        if self.loop and period > 0:
            elapsed = elapsed % period
        elif elapsed >= period:
            finished = True
        index = rec.index_at(elapsed)
        return ReplayFrame(
            timestamp=self._wall(),
            index=index,
            recorded_t=float(rec.t[index]),
            values=rec.values[index],
            na=rec.na_at(index),
            events=rec.events_at(index),
            notes=rec.notes_at(index),
            finished=finished,
        )

    def close(self) -> None:
        return None


def is_session_file(path: str | Path) -> bool:
    """True when ``path`` looks like a gpudiag session (by suffix, else by its first line)."""
    p = Path(path)
    if p.suffix.lower() in SUFFIXES:
        return True
    try:
        with p.open("rb") as f:
            head = f.readline(4096)
    except OSError:
        return False
    return SESSION_FORMAT.encode() in head


__all__ = [
    "SESSION_FORMAT",
    "SESSION_VERSION",
    "ReplayFrame",
    "SessionHeader",
    "SessionRecording",
    "SessionReplay",
    "SessionTick",
    "is_session_file",
    "write_session",
]
