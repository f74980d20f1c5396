"""Recorded sessions: the file format, playback at real speed, Monitor.save round trips, and the
shipped demo session being exactly what its assembly script makes from the real fixtures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpudiag.data import recording
from gpudiag.errors import GpuDiagError, ReplayError
from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import DEMO_SESSION, ReplayFeed
from gpudiag.probe.readings import Status
from gpudiag.probe.session_replay import SessionRecording, SessionReplay, is_session_file
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedFeed
from tests.monitoring import monitor_demo_recording


def test_the_shipped_demo_is_what_the_fixtures_make(fixtures_dir: Path, tmp_path: Path) -> None:
    rebuilt = monitor_demo_recording.build(fixtures_dir, tmp_path / DEMO_SESSION)
    assert rebuilt.read_bytes() == recording(DEMO_SESSION).read_bytes(), (
        "the shipped demo session is out of date: run "
        "`python tests/monitoring/monitor_demo_recording.py`"
    )


def test_the_demo_is_labelled_a_recording_and_names_its_sources() -> None:
    rec = SessionRecording.load(recording(DEMO_SESSION))
    assert "assembled" in rec.header.label
    assert "telegraf" in rec.header.recording
    assert "k8s-ai-conformance" in rec.header.recording
    assert "not a real session" in rec.header.notice
    assert rec.tick_count == 60
    notice = (recording(DEMO_SESSION).parent / "NOTICE.md").read_text()
    assert DEMO_SESSION in notice


def test_the_demo_alternates_the_rtx_3080_between_real_snapshots() -> None:
    rec = SessionRecording.load(recording(DEMO_SESSION))
    col = rec.header.series.index(["rtx-3080 box/gpu0", "gpu_util_pct"])
    # rtx-3080-v12.xml says 0 % (idle), rtx-3080-v13.xml 65 % (under load).
    assert rec.values[:, col].tolist() == ([0.0] * 10 + [65.0] * 10) * 3


def test_playback_follows_the_clock_and_loops() -> None:
    rec = SessionRecording.load(recording(DEMO_SESSION))
    clock = FakeClock(0.0)
    replay = SessionReplay(rec, clock=clock, wall_clock=lambda: 5.0)
    col = rec.header.series.index(["rtx-3080 box/gpu0", "gpu_util_pct"])
    seen = []
    for elapsed in (0.0, 9.9, 10.0, 10.5, 59.9, 60.0, 61.0, 70.5):
        clock.now = elapsed
        frame = replay.read()
        seen.append((frame.index, frame.values[col]))
    # 60 ticks of 1 s: after the 60th second playback starts over.
    assert seen == [
        (0, 0.0),
        (9, 0.0),
        (10, 65.0),
        (10, 65.0),
        (59, 65.0),
        (0, 0.0),
        (1, 0.0),
        (10, 65.0),
    ]


def test_playback_without_loop_finishes() -> None:
    rec = SessionRecording.load(recording(DEMO_SESSION))
    clock = FakeClock(0.0)
    replay = SessionReplay(rec, loop=False, clock=clock)
    assert replay.read().index == 0  # playback starts at the first read
    clock.now = 59.5
    assert not replay.read().finished
    clock.now = 61.0
    frame = replay.read()
    assert frame.finished
    assert frame.index == 59


def test_replayed_na_keeps_its_reason_and_throttling_its_markers() -> None:
    feed = ReplayFeed(SessionReplay.from_file(recording(DEMO_SESSION), clock=FakeClock(0.0)))
    m = Monitor(feed, interval=1.0, start=False)
    m.tick()
    reasons = {(s.device, s.metric): r for s, r in m.na_reasons().items()}
    status, reason = reasons[("gpu1-wl8sg/gpu0", "sm_active_pct")]
    assert status is Status.NOT_AVAILABLE
    assert "default counter list" in reason
    assert m.throttled_since()["rtx-3090 box/gpu0"].reasons == ("sw_power_cap",)
    assert m.is_recording


def test_save_and_replay_round_trip(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    feed = ScriptedFeed(
        clock,
        values=lambda n: [float(n), math.nan] if n % 2 else [float(n), 1.0],
        na=lambda n: {1: (Status.NO_PERMISSION, "needs root")} if n % 2 else {},
        events=lambda n: {"gpu0": ("sw_power_cap",)} if n >= 3 else {},
    )
    m = Monitor(feed, interval=0.5, start=False, clock=clock)
    for _ in range(6):
        m.tick()
        clock.advance(0.5)
    path = m.save(tmp_path / "run.jsonl", label="my run")
    assert is_session_file(path)
    rec = SessionRecording.load(path)
    assert rec.header.label == "my run"
    assert rec.t.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert rec.values[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert np.isnan(rec.values[0, 1])
    assert rec.na_at(0) == {1: (Status.NO_PERMISSION, "needs root")}
    assert rec.na_at(1) == {}
    assert rec.events_at(1) == {}
    assert rec.events_at(4) == {"gpu0": ("sw_power_cap",)}


def test_a_saved_session_keeps_only_what_the_ring_held(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, history_s=9.0, start=False, clock=clock)
    for _ in range(50):
        m.tick()
        clock.advance(1.0)
    rec = SessionRecording.load(m.save(tmp_path / "tail.jsonl"))
    assert rec.values[:, 0].tolist() == [float(n) for n in range(35, 51)]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "empty"),
        (b"not json\n", "not JSON"),
        (b'{"format": "other", "version": 1}\n', "not a session header"),
        (
            b'{"format":"something.else","version":1,"label":"x","recording":"x",'
            b'"interval_s":1,"devices":[],"series":[]}\n',
            "not a gpudiag session",
        ),
        (
            b'{"format":"gpudiag.session","version":9,"label":"x","recording":"x",'
            b'"interval_s":1,"devices":[],"series":[]}\n',
            "upgrade gpudiag",
        ),
        (
            b'{"format":"gpudiag.session","version":1,"label":"x","recording":"x",'
            b'"interval_s":1,"devices":[],"series":[["d","m"]]}\n{"t":0,"v":[1,2]}\n',
            "2 values for 1 series",
        ),
        (
            b'{"format":"gpudiag.session","version":1,"label":"x","recording":"x",'
            b'"interval_s":1,"devices":[],"series":[["d","m"]]}\n{"t":1,"v":[1]}\n{"t":0,"v":[1]}\n',
            "backwards",
        ),
    ],
)
def test_broken_sessions_are_explained(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_bytes(content)
    with pytest.raises(ReplayError, match=words):
        SessionRecording.load(path)


def test_a_recording_can_be_narrowed_to_some_devices() -> None:
    replay = SessionReplay.from_file(recording(DEMO_SESSION), clock=FakeClock(0.0))
    feed = ReplayFeed(replay, devices=["gpu1-wl8sg/gpu0", 1])
    assert [d.id for d in feed.devices] == ["rtx-3090 box/gpu0", "gpu1-wl8sg/gpu0"]
    m = Monitor(feed, interval=1.0, start=False)
    m.tick()
    assert {s.device for s in m.series} == {"rtx-3090 box/gpu0", "gpu1-wl8sg/gpu0"}
    assert m.samples()[("gpu1-wl8sg/gpu0", "power_w")].iloc[0] == 35.686
    reasons = {(s.device, s.metric) for s in m.na_reasons()}
    assert ("gpu1-wl8sg/gpu0", "sm_active_pct") in reasons
    assert m.throttled_since()["rtx-3090 box/gpu0"].reasons == ("sw_power_cap",)
    with pytest.raises(GpuDiagError, match="no device 'gpu9'"):
        ReplayFeed(replay, devices=["gpu9"])
