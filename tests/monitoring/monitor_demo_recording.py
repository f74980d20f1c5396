"""Assembles the shipped demo session (gpudiag/data/recordings/demo-cluster.session.jsonl).

Every value comes from a real recording in tests/fixtures, passed through gpudiag's own
parsers and the monitor's GPU feed; only the timeline is made up (each tick repeats a real
snapshot). Run ``python tests/monitoring/monitor_demo_recording.py`` to rebuild the file;
``test_monitor_recording.py`` checks that the shipped file is exactly what this produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import DEMO_SESSION, GpuFeed
from gpudiag.probe.dcgm import ActivityCounters, parse_exporter_text
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState
from gpudiag.probe.readings import Reading, Status, ok
from gpudiag.probe.smi_xml import parse_smi_xml

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "gpudiag" / "data" / "recordings" / DEMO_SESSION

TICKS = 60
INTERVAL_S = 1.0
SWITCH_EVERY = 10  # the RTX 3080 alternates idle / under load every 10 ticks

NOTICE = (
    "Assembled for demos, not a real session: five GPUs on five different machines, each "
    "tick repeating one real snapshot. RTX 3080: nvidia-smi XML rtx-3080-v12 (idle) and "
    "rtx-3080-v13 (under load; same UUID), alternating every 10 s; RTX 3090: 3090-v13 "
    "(sw_power_cap active while idle); L4, L40S, GRID A100-10C (vGPU): dcgm-exporter scrapes "
    "kops-aws-l4, upcloud-l40s, vks-grid-a100-10c. Sources and licences: NOTICE.md."
)
RECORDING = (
    "assembled from real recordings: nvidia-smi -q -x dumps (influxdata/telegraf test data, "
    "MIT) and dcgm-exporter scrapes (cncf/k8s-ai-conformance evidence, Apache-2.0)"
)
NO_COUNTERS = (
    "nvidia-smi -q -x has no activity counters (SM active, tensor, DRAM): DCGM or NVML GPM "
    "give them"
)


class _Playlist:
    """A recorded backend whose ``sample()`` follows a fixed schedule of real snapshots."""

    is_recording = True
    label = "recording: demo cluster (assembled)"

    def __init__(
        self,
        infos: tuple[GpuInfo, ...],
        hosts: tuple[str, ...],
        states: list[list[GpuState]],
        activity: list[list[ActivityCounters]],
    ) -> None:
        self._infos = infos
        self.hosts = hosts
        self._states = states
        self._activity = activity
        self.tick = 0

    def gpu_count(self) -> Reading[int]:
        return ok(len(self._infos), "replay")

    def driver(self) -> DriverInfo:
        return DriverInfo()

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return self._infos

    def sample(self) -> tuple[GpuState, ...]:
        return tuple(self._states[self.tick % len(self._states)])

    def close(self) -> None:
        return None


class _PlaylistCounters:
    label = "recorded dcgm-exporter fields"

    def __init__(self, playlist: _Playlist) -> None:
        self._playlist = playlist

    def read(self) -> tuple[ActivityCounters, ...]:
        p = self._playlist
        return tuple(p._activity[p.tick % len(p._activity)])

    def close(self) -> None:
        return None


def build(fixtures: Path, output: Path = OUTPUT) -> Path:
    smi = fixtures / "nvidia-smi-xml"
    idle = parse_smi_xml((smi / "rtx-3080-v12.xml").read_bytes())
    load = parse_smi_xml((smi / "rtx-3080-v13.xml").read_bytes())
    capped = parse_smi_xml((smi / "3090-v13.xml").read_bytes())
    exporters = [
        parse_exporter_text(
            (fixtures / "dcgm-exporter" / name).read_text(), f"the recorded scrape {name}"
        )[0]
        for name in ("kops-aws-l4.prom", "upcloud-l40s.prom", "vks-grid-a100-10c.prom")
    ]
    no_counters = ActivityCounters.unavailable(Status.NOT_AVAILABLE, NO_COUNTERS, "recording")
    infos = (load.infos[0], capped.infos[0], *(g.info for g in exporters))
    hosts = ("rtx-3080 box", "rtx-3090 box", *(g.host for g in exporters))
    states, activity = [], []
    for tick in range(TICKS):
        rtx3080 = (load if (tick // SWITCH_EVERY) % 2 else idle).states[0]
        states.append([rtx3080, capped.states[0], *(g.state for g in exporters)])
        activity.append([no_counters, no_counters, *(g.activity for g in exporters)])
    playlist = _Playlist(infos, hosts, states, activity)
    clock = [0.0]
    feed = GpuFeed(playlist, counters=_PlaylistCounters(playlist), clock=lambda: clock[0])
    monitor = Monitor(feed, interval=INTERVAL_S, history_s=TICKS * INTERVAL_S, start=False)
    for tick in range(TICKS):
        playlist.tick = tick
        clock[0] = tick * INTERVAL_S
        monitor.tick()
    monitor.stop()
    return monitor.save(
        output,
        label="demo cluster (assembled from real recordings)",
        recording=RECORDING,
        notice=NOTICE,
        started_at="",
    )


if __name__ == "__main__":
    fixtures = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures"
    print(build(fixtures))
