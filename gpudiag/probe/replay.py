"""The replay backend: a recorded machine (nvidia-smi XML or text, or a gpudiag JSON snapshot)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from gpudiag._files import RECORDING_BYTES, read_bytes
from gpudiag._values import load_json
from gpudiag.errors import ReplayError
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState, HostInfo, record_from_dict
from gpudiag.probe.readings import Reading, ok
from gpudiag.probe.smi_text import TABLE_HOLDS, looks_like_smi_text, parse_smi_text
from gpudiag.probe.smi_xml import parse_smi_xml
from gpudiag.probe.topology import SOURCE_RECORDING, Topology

SNAPSHOT_FORMAT = "gpudiag.snapshot"
SNAPSHOT_VERSION = 1


class ReplayBackend:
    """Plays back one recorded machine. Every report built from it is labelled a recording.

    ``sample()`` returns the recorded state stamped with the current time, so monitors and
    notebooks run the same code paths as on live hardware.
    """

    is_recording = True

    def __init__(
        self,
        driver: DriverInfo,
        infos: tuple[GpuInfo, ...],
        states: tuple[GpuState, ...],
        *,
        label: str,
        host: HostInfo | None = None,
        recorded_at: str = "",
        topology: Topology | None = None,
    ) -> None:
        if len(infos) != len(states):
            raise ReplayError(f"recording has {len(infos)} GPUs but {len(states)} states")
        self.label = f"recording: {label}"
        self.host = host
        self.recorded_at = recorded_at
        self._topology = topology
        self._driver = driver
        self._infos = infos
        self._states = states

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ReplayBackend:
        """Load ``nvidia-smi -q -x`` XML, ``nvidia-smi -q`` or ``nvidia-smi`` text, or a gpudiag
        JSON snapshot (``gpudiag inspect --json``); the format is detected from the content."""
        p = Path(path)
        data = read_bytes(p, "recording", max_bytes=RECORDING_BYTES, error=ReplayError)
        head = data.lstrip()[:1]
        if head == b"<":
            rec = parse_smi_xml(data)
            return cls(rec.driver, rec.infos, rec.states, label=p.name, recorded_at=rec.timestamp)
        if head == b"{":
            snapshot = load_json(data, p.name, error=ReplayError)
            return cls.from_snapshot(snapshot, label=p.name)
        kind = looks_like_smi_text(data)
        if kind is not None:
            rec = parse_smi_text(data)
            label = p.name if kind == "query" else f"{p.name} ({TABLE_HOLDS})"
            return cls(rec.driver, rec.infos, rec.states, label=label, recorded_at=rec.timestamp)
        raise ReplayError(
            f"{p.name} is neither nvidia-smi output (`nvidia-smi -q -x`, `nvidia-smi -q` or "
            "`nvidia-smi`) nor a gpudiag JSON snapshot"
        )

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any], *, label: str = "snapshot") -> ReplayBackend:
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ReplayError(
                f'not a gpudiag snapshot (expected "format": "{SNAPSHOT_FORMAT}"); '
                "make one with `gpudiag inspect --json > machine.json`"
            )
        version = snapshot.get("version")
        if version != SNAPSHOT_VERSION:
            raise ReplayError(
                f"snapshot version {version!r} is not supported (this gpudiag reads "
                f"version {SNAPSHOT_VERSION}); upgrade gpudiag"
            )
        try:
            gpus = snapshot.get("gpus", [])
            infos = tuple(record_from_dict(GpuInfo, g["info"]) for g in gpus)
            states = tuple(record_from_dict(GpuState, g["state"]) for g in gpus)
            driver = record_from_dict(DriverInfo, snapshot.get("driver", {}))
            host = record_from_dict(HostInfo, snapshot["host"]) if "host" in snapshot else None
            topology = _recorded_topology(snapshot.get("topology"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(
                f"snapshot {label} is malformed: {type(exc).__name__}: {exc}"
            ) from None
        return cls(
            driver,
            infos,
            states,
            label=label,
            host=host,
            recorded_at=str(snapshot.get("recorded_at", "")),
            topology=topology,
        )

    def gpu_count(self) -> Reading[int]:
        return ok(len(self._infos), "replay")

    def topology(self) -> Topology | None:
        """The recorded topology (snapshots made since it was added), else None."""
        return self._topology

    def driver(self) -> DriverInfo:
        return self._driver

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return self._infos

    def sample(self) -> tuple[GpuState, ...]:
        now = time.time()
        return tuple(dataclasses.replace(s, timestamp=now) for s in self._states)

    def close(self) -> None:
        return None


def _recorded_topology(data: Any) -> Topology | None:
    """The snapshot's topology (absent in older snapshots), its source marked as recorded."""
    if data is None:
        return None
    topology = Topology.from_dict(data)
    if topology.source.startswith(SOURCE_RECORDING):
        return topology
    recorded = f"{SOURCE_RECORDING} ({topology.source})" if topology.source else SOURCE_RECORDING
    return dataclasses.replace(topology, source=recorded)
