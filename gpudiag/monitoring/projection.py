"""What a view of a monitor shows: every GPU, one node's GPUs, or each node aggregated.

A 64-node x 8-GPU job is 512 devices: one strip per GPU and metric is more than a browser can
draw or a person can read. A projection maps the monitor's columns onto fewer series (one
node's GPUs; or per node the mean, min and max over its GPUs), so a view sends and draws only
those, and a straggler still shows (the min of its node drops away from the mean).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpudiag.monitoring.metrics import DeviceSpec, SeriesKey
from gpudiag.probe.readings import Status

# Per node: the mean over its GPUs, and the min and max that show one GPU apart from the rest.
NODE_LANES: tuple[str, ...] = ("mean", "min", "max")
# Counts and flags: any GPU of the node is what matters.
MAX_ONLY = frozenset(
    {"throttled", "xid_last", "ecc_uncorrected_volatile", "remapped_rows_uncorrectable"}
)
EVERY_GPU_LIMIT = 64  # more devices than this: no "every GPU" view


@dataclass(frozen=True)
class Projection:
    """Series of a view, each computed from columns of the monitor's rows.

    ``columns[i]`` holds the monitor's column indices that series ``i`` reduces with
    ``reducers[i]`` ("first", "mean", "min", "max"); NaN (N/A) values are skipped, and a series
    is N/A only when every column it reads is.
    """

    name: str
    devices: tuple[DeviceSpec, ...]
    series: tuple[SeriesKey, ...]
    units: tuple[str, ...]
    columns: tuple[np.ndarray, ...]
    reducers: tuple[str, ...]
    owner: Mapping[str, str]  # monitor device id -> the projected device that shows it
    note: str = ""

    @property
    def width(self) -> int:
        return len(self.series)

    def apply(self, values: np.ndarray) -> np.ndarray:
        """Rows of the monitor (rows x its columns) -> rows of this view (rows x width).

        Series that read the same number of columns are reduced together (one gather and
        three reductions per group, not one per series: 4096 node-view series of 512 GPUs
        cost a few milliseconds a row)."""
        values = np.atleast_2d(values)
        out = np.full((values.shape[0], self.width), np.nan, dtype=np.float64)
        if not values.shape[0] or not self.width:
            return out
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN
            for index, gather, how in self._groups():
                block = values[:, gather]  # rows x series x columns
                if block.shape[2] == 1:
                    out[:, index] = block[:, :, 0]
                    continue
                for name, reduce in (("mean", np.nanmean), ("min", np.nanmin), ("max", np.nanmax)):
                    pick = how == name
                    if pick.any():
                        out[:, index[pick]] = reduce(block[:, pick, :], axis=2)
                first = how == "first"
                if first.any():
                    out[:, index[first]] = block[:, first, 0]
        return out

    def _groups(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        cached = self.__dict__.get("_group_cache")
        if cached is None:
            by_size: dict[int, list[int]] = {}
            for i, cols in enumerate(self.columns):
                by_size.setdefault(len(cols), []).append(i)
            cached = [
                (
                    np.array(members),
                    np.stack([self.columns[i] for i in members]),
                    np.array([self.reducers[i] for i in members]),
                )
                for members in by_size.values()
            ]
            object.__setattr__(self, "_group_cache", cached)
        return cached

    def na(self, reasons: Mapping[int, tuple[Status, str]]) -> dict[int, tuple[Status, str]]:
        """N/A reasons of this view's series: a series is N/A when all its columns are."""
        out = {}
        for i, cols in enumerate(self.columns):
            missing = [reasons[int(c)] for c in cols if int(c) in reasons]
            if len(missing) == len(cols):
                out[i] = missing[0]
        return out

    def notes(self, notes: Mapping[int, str]) -> dict[int, str]:
        out = {}
        for i, cols in enumerate(self.columns):
            found = next((notes[int(c)] for c in cols if int(c) in notes), None)
            if found is not None:
                out[i] = found
        return out

    def devices_of(self, device_ids: Sequence[str]) -> dict[str, list[str]]:
        """Projected device -> the monitor devices among ``device_ids`` it shows."""
        out: dict[str, list[str]] = {}
        for d in device_ids:
            if d in self.owner:
                out.setdefault(self.owner[d], []).append(d)
        return out


def nodes_of(devices: Sequence[DeviceSpec]) -> dict[str, list[DeviceSpec]]:
    """GPUs by node (a device's ``host``), in the monitor's order; empty for one machine."""
    nodes: dict[str, list[DeviceSpec]] = {}
    for d in devices:
        if d.kind == "gpu" and d.host:
            nodes.setdefault(d.host, []).append(d)
    return nodes if len(nodes) > 1 else {}


def every_device(
    devices: Sequence[DeviceSpec], series: Sequence[SeriesKey], units: Sequence[str]
) -> Projection:
    """Every series as it is."""
    return Projection(
        name="every GPU",
        devices=tuple(devices),
        series=tuple(series),
        units=tuple(units),
        columns=tuple(np.array([i]) for i in range(len(series))),
        reducers=("first",) * len(series),
        owner={d.id: d.id for d in devices},
    )


def one_node(
    node: str, devices: Sequence[DeviceSpec], series: Sequence[SeriesKey], units: Sequence[str]
) -> Projection:
    """The GPUs of ``node``, one row each."""
    keep = {d.id for d in devices if d.host == node}
    index = [i for i, s in enumerate(series) if s.device in keep]
    return Projection(
        name=node,
        devices=tuple(d for d in devices if d.id in keep),
        series=tuple(series[i] for i in index),
        units=tuple(units[i] for i in index),
        columns=tuple(np.array([i]) for i in index),
        reducers=("first",) * len(index),
        owner={d: d for d in keep},
        note=f"node {node}: its {len(keep)} GPUs",
    )


def by_node(
    devices: Sequence[DeviceSpec], series: Sequence[SeriesKey], units: Sequence[str]
) -> Projection:
    """One row per node; each metric as the mean, min and max over the node's GPUs (counts
    and flags: the max)."""
    nodes = nodes_of(devices)
    where = {(s.device, s.name): i for i, s in enumerate(series)}
    out_devices: list[DeviceSpec] = []
    out_series: list[SeriesKey] = []
    out_units: list[str] = []
    columns: list[np.ndarray] = []
    reducers: list[str] = []
    owner: dict[str, str] = {}
    for node, gpus in nodes.items():
        node_id = f"node:{node}"
        names = [s.name for s in series if s.device == gpus[0].id]
        out_devices.append(
            DeviceSpec(
                id=node_id,
                label=f"{node} · {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}",
                kind="node",
                name=gpus[0].name,
                host=node,
                facts={"gpus": [d.id for d in gpus]},
            )
        )
        for d in gpus:
            owner[d.id] = node_id
        for name in names:
            cols = np.array([where[(d.id, name)] for d in gpus if (d.id, name) in where])
            if not cols.size:
                continue
            metric = name.split("[", 1)[0]
            lanes = ("max",) if metric in MAX_ONLY else NODE_LANES
            for lane in lanes:
                out_series.append(SeriesKey(node_id, metric, lane if len(lanes) > 1 else ""))
                out_units.append(units[int(cols[0])])
                columns.append(cols)
                reducers.append(lane)
    return Projection(
        name="by node",
        devices=tuple(out_devices),
        series=tuple(out_series),
        units=tuple(out_units),
        columns=tuple(columns),
        reducers=tuple(reducers),
        owner=owner,
        note=f"{len(nodes)} nodes, one row each: mean, min and max over each node's GPUs "
        "(blue, orange, green); pick a node to see its GPUs",
    )


__all__ = [
    "EVERY_GPU_LIMIT",
    "NODE_LANES",
    "Projection",
    "by_node",
    "every_device",
    "nodes_of",
    "one_node",
]
