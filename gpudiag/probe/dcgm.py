"""DCGM activity counters (SM active, occupancy, tensor, DRAM): host engine or dcgm-exporter.

Two ways in, both optional:

* the Python bindings a DCGM install ships (``pydcgm``, ``dcgm_fields``, ``dcgm_structs``,
  usually under ``/usr/local/dcgm/bindings/python3``), talking to a running host engine
  (``nv-hostengine`` or the ``nvidia-dcgm`` service). Detected at run time. This path is
  written against DCGM's published Python API and tested with an import-level fake only:
  untested on a real DCGM install.
* the Prometheus text that a dcgm-exporter serves on ``http://HOST:9400/metrics``. Several
  exporter URLs make one backend, which is how one notebook watches a cluster's GPUs. The
  parser is tested on real scrapes.

``DCGM_FI_PROF_*`` fields are ratios of time (0 to 1); here they become percentages.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import importlib
import math
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from gpudiag.errors import ArgumentError, PrometheusParseError
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState
from gpudiag.probe.netread import http_get
from gpudiag.probe.readings import Reading, Status, na, ok

# Where DCGM packages install their Python bindings (DCGM user guide, "Python bindings").
DCGM_BINDINGS_DIR = "/usr/local/dcgm/bindings/python3"

PROFILING_PERMISSION_FIX = (
    "the NVIDIA driver lets only admin users read GPU performance counters "
    "(NVreg_RestrictProfilingToAdminUsers=1, the ERR_NVGPUCTRPERM case). Fix: run the reader "
    "(nv-hostengine, dcgm-exporter, or this kernel) as root, or allow all users with "
    "`echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | "
    "sudo tee /etc/modprobe.d/nvidia-profiling.conf` and reload the nvidia module or reboot "
    "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)

_MIB = 1 << 20


def _unavailable() -> Reading[Any]:
    return na(Status.NOT_AVAILABLE, "no activity-counter source", "")


@dataclass(frozen=True, slots=True)
class ActivityCounters:
    """Hardware activity of one GPU over the last sampling period, in percent of time.

    These answer "is the GPU busy doing useful work" better than ``gpu_util_pct`` (which is
    only "a kernel was running"): ``sm_active_pct`` is the share of time an SM had a warp
    (DCGM_FI_PROF_SM_ACTIVE; NVML GPM SM_UTIL); ``sm_occupancy_pct`` the resident warps
    against the maximum (DCGM_FI_PROF_SM_OCCUPANCY); ``tensor_active_pct`` the tensor-pipe
    activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE; GPM ANY_TENSOR_UTIL); ``dram_active_pct`` the
    share of cycles the memory interface moved data, i.e. achieved bandwidth against peak
    (DCGM_FI_PROF_DRAM_ACTIVE; GPM DRAM_BW_UTIL). Check by hand with
    ``dcgmi dmon -e 1001,1002,1003,1004,1005``. N/A keeps its reason (no permission, not
    exported, not supported by this GPU).
    """

    gr_engine_active_pct: Reading[float] = field(default_factory=_unavailable)
    sm_active_pct: Reading[float] = field(default_factory=_unavailable)
    sm_occupancy_pct: Reading[float] = field(default_factory=_unavailable)
    tensor_active_pct: Reading[float] = field(default_factory=_unavailable)
    dram_active_pct: Reading[float] = field(default_factory=_unavailable)
    nvlink_rx_bytes_per_s: Reading[float] = field(default_factory=_unavailable)
    nvlink_tx_bytes_per_s: Reading[float] = field(default_factory=_unavailable)

    @classmethod
    def unavailable(cls, status: Status, reason: str, source: str = "") -> ActivityCounters:
        """Every counter N/A for the same reason (no permission, no host engine, ...)."""
        missing = na(status, reason, source)
        return cls(**{f.name: missing for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_dict() for f in fields(self)}


# -- Prometheus text format ---------------------------------------------------------------

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class PromSample:
    """One sample line of Prometheus text exposition format (``name{labels} value [ts]``)."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


def _parse_labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    n = len(line)
    pos += 1  # past "{"
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if m is None:
            raise PrometheusParseError(f"line {lineno}: bad label name at column {pos + 1}")
        name = m.group()
        pos = m.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 2] != '="':
            raise PrometheusParseError(f'line {lineno}: expected =" after label {name!r}')
        pos += 2
        chars: list[str] = []
        while True:
            if pos >= n:
                raise PrometheusParseError(f"line {lineno}: unterminated value of label {name!r}")
            c = line[pos]
            if c == "\\" and pos + 1 < n:
                chars.append(_ESCAPES.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif c == '"':
                pos += 1
                break
            else:
                chars.append(c)
                pos += 1
        labels[name] = "".join(chars)
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1


def _parse_float(text: str, lineno: int) -> float:
    if not text.isascii():  # float() reads other scripts' digits ("١٢" -> 12.0)
        raise PrometheusParseError(f"line {lineno}: {text[:40]!r} is not a number")
    lowered = text.lower()
    if lowered in {"+inf", "inf"}:
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise PrometheusParseError(f"line {lineno}: {text[:40]!r} is not a number") from None


# A dcgm-exporter page holds about 40 series per GPU (a few hundred per node); these caps
# stop a runaway page (a million series: MemoryError after 48 s before they existed) early.
MAX_SERIES = 200_000
MAX_GPUS_PER_PAGE = 4096


def parse_prometheus_text(
    text: str, *, max_series: int | None = MAX_SERIES
) -> tuple[PromSample, ...]:
    """Parse Prometheus text exposition format (what ``/metrics`` of an exporter returns).

    ``# HELP`` / ``# TYPE`` and other comments are skipped; label values are unescaped
    (``\\\\``, ``\\"``, ``\\n``); ``NaN`` and ``+Inf`` are read as floats. Raises
    ``PrometheusParseError`` naming the first malformed line, or when the text holds more
    than ``max_series`` samples (None: no cap).

    Written here rather than taken from ``prometheus_client.parser``: that parser renames the
    samples of a ``counter`` family (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` comes back as
    ``..._total``, a name Prometheus never stores) and took 3x as long on a 200-GPU page
    (0.17 s against 0.06 s, measured on this repository's L4 scrape repeated).
    """
    out: list[PromSample] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if max_series is not None and len(out) >= max_series:
            raise PrometheusParseError(
                f"more than {max_series} series (line {lineno}): not a dcgm-exporter page of "
                "one node, or one too large to watch this way"
            )
        m = _NAME.match(line)
        if m is None:
            raise PrometheusParseError(f"line {lineno}: no metric name in {raw[:80]!r}")
        name, pos = m.group(), m.end()
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos, lineno)
        rest = line[pos:].split()
        if not rest or len(rest) > 2:
            raise PrometheusParseError(f"line {lineno}: expected 'value [timestamp]' after {name}")
        value = _parse_float(rest[0], lineno)
        ts = None
        if len(rest) == 2:
            if not (rest[1].isascii() and rest[1].lstrip("-").isdigit()):
                raise PrometheusParseError(f"line {lineno}: bad timestamp {rest[1][:40]!r}")
            ts = int(rest[1])
        out.append(PromSample(name, labels, value, ts))
    return tuple(out)


def ascii_int(text: str) -> int | None:
    """``"3"`` -> 3; None for anything but ASCII digits (``str.isdigit`` also accepts ``"²"``,
    which ``int`` refuses)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


# -- dcgm-exporter scrapes -> probe records ---------------------------------------------

EXPORTER_SOURCE = "dcgm-exporter"

# dcgm-exporter's default counter list leaves these commented out; they must be added to
# the CSV given with ``-f`` (``--collectors``) to be exported.
_OPT_IN_FIELDS = frozenset(
    {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
)


def normalize_exporter_url(url: str) -> str:
    """``node1:9400`` -> ``http://node1:9400/metrics``; full URLs are kept as they are."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.path in {"", "/"}:
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def scrape(url: str, *, timeout_s: float = 2.0, max_bytes: int = 32 * _MIB) -> Reading[str]:
    """GET one exporter's ``/metrics`` text within ``timeout_s`` overall (a server that
    trickles bytes is cut off at the deadline) and ``max_bytes``; failures are N/A readings
    with the reason."""
    target = normalize_exporter_url(url)
    got = http_get(
        target,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        accept="text/plain",
        source=EXPORTER_SOURCE,
    )
    if not got.ok or got.value is None:
        reason = got.reason
        if got.status is Status.NOT_FOUND:
            reason += ": is dcgm-exporter running and the port open?"
        return na(got.status, reason, EXPORTER_SOURCE)
    answer = got.value
    if answer.status != 200:
        return na(
            Status.UNKNOWN,
            f"{target} answered HTTP {answer.status} {answer.reason}".rstrip(),
            EXPORTER_SOURCE,
        )
    return ok(answer.text, EXPORTER_SOURCE)


GpuKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class ExporterGpu:
    """One GPU (or MIG instance) seen in a dcgm-exporter scrape (or a Prometheus answer).

    ``url`` is where it was read (the exporter URL, or the Prometheus series' ``instance``);
    ``host`` the node (the exporter's ``Hostname`` label, else the URL's host).
    """

    url: str
    host: str
    info: GpuInfo
    state: GpuState
    activity: ActivityCounters
    driver_version: str | None = None
    gpu_label: str = ""
    mig_id: str = ""

    @property
    def key(self) -> GpuKey:
        """Stable identity across reads: the node, the GPU UUID, its index, the MIG instance."""
        return (self.host, str(self.info.uuid.get("")), self.gpu_label, self.mig_id)


@functools.lru_cache(maxsize=8192)  # a reading is immutable; 512 GPUs ask ~6000 times a tick
def _not_exported(name: str, url: str) -> Reading[Any]:
    if name in _OPT_IN_FIELDS:
        reason = (
            f"{name} is not exported by {url}: dcgm-exporter's default counter list leaves it "
            "out; add it to the counters CSV passed with -f"
        )
    elif name.startswith("DCGM_FI_PROF_"):
        reason = (
            f"{name} is not exported by {url}: the exporter's counter list lacks it, or it "
            "could not watch profiling fields (check its log for 'requires root', "
            "'profiling is not supported', or a vGPU/MIG guest)"
        )
    else:
        reason = f"{name} is not exported by {url} (not in its counter list, or not on this GPU)"
    return na(Status.NOT_AVAILABLE, reason, EXPORTER_SOURCE)


def _nvlink_note(name: str, values: Mapping[str, float], url: str) -> Reading[Any]:
    if name in values:
        return na(Status.NOT_AVAILABLE, f"given as a rate ({name})", EXPORTER_SOURCE)
    return _not_exported(name, url)


def _decode_reasons(mask: int) -> tuple[str, ...]:
    from gpudiag.probe.nvml_backend import decode_clock_event_reasons

    return decode_clock_event_reasons(mask)


def node_of(labels: Mapping[str, str], url: str) -> str:
    """The node a series comes from: dcgm-exporter's ``Hostname`` label, else the host part
    of Prometheus's ``instance`` label, else the URL's host."""
    if labels.get("Hostname"):
        return labels["Hostname"]
    instance = labels.get("instance", "")
    if instance:
        return urllib.parse.urlsplit("//" + instance).hostname or instance
    return urllib.parse.urlsplit(url).hostname or url


def gpus_from_samples(samples: Iterable[PromSample], url: str) -> tuple[ExporterGpu, ...]:
    """Group ``DCGM_FI_*`` samples by node and GPU and turn them into probe records.

    Raises ``PrometheusParseError`` past ``MAX_GPUS_PER_PAGE`` GPUs (a runaway answer)."""
    per_gpu: dict[GpuKey, dict[str, float]] = {}
    labels_of: dict[GpuKey, Mapping[str, str]] = {}
    for s in samples:
        if not s.name.startswith("DCGM_FI_"):
            continue
        labels = s.labels
        key = (
            node_of(labels, url),
            labels.get("UUID", ""),
            labels.get("gpu", ""),
            labels.get("GPU_I_ID", ""),
        )
        values = per_gpu.get(key)
        if values is None:
            if len(per_gpu) >= MAX_GPUS_PER_PAGE:
                raise PrometheusParseError(
                    f"more than {MAX_GPUS_PER_PAGE} GPUs in one answer from {url}: narrow it"
                )
            values = per_gpu[key] = {}
            labels_of[key] = labels
        values[s.name] = s.value

    def _gpu_order(k: GpuKey) -> tuple[str, int, str, str]:
        index = ascii_int(k[2])
        return (k[0], index if index is not None else 1 << 30, k[1], k[3])

    return tuple(
        _exporter_gpu(per_gpu[key], labels_of[key], url) for key in sorted(per_gpu, key=_gpu_order)
    )


def _exporter_gpu(values: Mapping[str, float], labels: Mapping[str, str], url: str) -> ExporterGpu:
    def get(name: str, scale: float = 1.0) -> Reading[float]:
        if name not in values or not math.isfinite(values[name]):
            return _not_exported(name, url)
        return ok(values[name] * scale, EXPORTER_SOURCE)

    def first(*names: str, scale: float = 1.0) -> Reading[float]:
        for name in names:
            if name in values:
                return get(name, scale)
        return _not_exported(names[0], url)

    def as_int(r: Reading[float]) -> Reading[int]:
        if r.ok and r.value is not None:
            return ok(int(r.value), r.source)
        return na(r.status, r.reason, r.source)

    fb = [values.get(n) for n in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED")]
    reserved = values.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
    if all(v is not None and math.isfinite(v) for v in fb) and math.isfinite(reserved):
        total: Reading[int] = ok(int((sum(v for v in fb if v) + reserved) * _MIB), EXPORTER_SOURCE)
    else:
        total = _not_exported("DCGM_FI_DEV_FB_FREE", url)
    uuid = labels.get("UUID", "")
    mig_id = labels.get("GPU_I_ID", "")
    gpu_label = labels.get("gpu", "")
    gpu_index = ascii_int(gpu_label)
    name = labels.get("modelName", "")
    if mig_id:
        name = f"{name} MIG {labels.get('GPU_I_PROFILE', '')} (instance {mig_id})".strip()
    info = GpuInfo(
        index=gpu_index if gpu_index is not None else 0,
        name=ok(name, EXPORTER_SOURCE) if name else _not_exported("modelName label", url),
        uuid=ok(uuid, EXPORTER_SOURCE) if uuid else _not_exported("UUID label", url),
        pci_bus_id=ok(labels["pci_bus_id"].upper(), EXPORTER_SOURCE)
        if labels.get("pci_bus_id")
        else _not_exported("pci_bus_id label", url),
        memory_total_bytes=total,
        power_limit_w=get("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
        mig_enabled=ok(bool(mig_id), EXPORTER_SOURCE),
    )
    reasons_raw = first("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    reasons: Reading[tuple[str, ...]] = (
        ok(_decode_reasons(int(reasons_raw.value or 0)), EXPORTER_SOURCE)
        if reasons_raw.ok
        else na(reasons_raw.status, reasons_raw.reason, reasons_raw.source)
    )
    remap_failed = get("DCGM_FI_DEV_ROW_REMAP_FAILURE")
    state = GpuState(
        timestamp=time.time(),
        gpu_util_pct=get("DCGM_FI_DEV_GPU_UTIL"),
        memory_util_pct=get("DCGM_FI_DEV_MEM_COPY_UTIL"),
        memory_used_bytes=as_int(get("DCGM_FI_DEV_FB_USED", _MIB)),
        sm_clock_mhz=as_int(get("DCGM_FI_DEV_SM_CLOCK")),
        memory_clock_mhz=as_int(get("DCGM_FI_DEV_MEM_CLOCK")),
        power_w=get("DCGM_FI_DEV_POWER_USAGE"),
        temperature_c=get("DCGM_FI_DEV_GPU_TEMP"),
        clock_event_reasons=reasons,
        pcie_rx_bytes_per_s=first("DCGM_FI_PROF_PCIE_RX_BYTES"),
        pcie_tx_bytes_per_s=first("DCGM_FI_PROF_PCIE_TX_BYTES"),
        # Exporters give NVLink rates (in ActivityCounters), not cumulative counters.
        nvlink_rx_bytes=_nvlink_note("DCGM_FI_PROF_NVLINK_RX_BYTES", values, url),
        nvlink_tx_bytes=_nvlink_note("DCGM_FI_PROF_NVLINK_TX_BYTES", values, url),
        ecc_uncorrected_volatile=as_int(get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
        remapped_rows_uncorrectable=as_int(get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")),
        row_remap_failed=ok(bool(remap_failed.value), EXPORTER_SOURCE)
        if remap_failed.ok
        else na(remap_failed.status, remap_failed.reason, remap_failed.source),
        xid_last=as_int(get("DCGM_FI_DEV_XID_ERRORS")),
    )
    activity = ActivityCounters(
        gr_engine_active_pct=get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 100.0),
        sm_active_pct=get("DCGM_FI_PROF_SM_ACTIVE", 100.0),
        sm_occupancy_pct=get("DCGM_FI_PROF_SM_OCCUPANCY", 100.0),
        tensor_active_pct=get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
        dram_active_pct=get("DCGM_FI_PROF_DRAM_ACTIVE", 100.0),
        nvlink_rx_bytes_per_s=get("DCGM_FI_PROF_NVLINK_RX_BYTES"),
        nvlink_tx_bytes_per_s=get("DCGM_FI_PROF_NVLINK_TX_BYTES"),
    )
    return ExporterGpu(
        url=labels.get("instance") or url,
        host=node_of(labels, url),
        info=info,
        state=state,
        activity=activity,
        driver_version=labels.get("DCGM_FI_DRIVER_VERSION"),
        gpu_label=gpu_label,
        mig_id=mig_id,
    )


def parse_exporter_text(text: str, url: str = "recording") -> tuple[ExporterGpu, ...]:
    """A whole ``/metrics`` text -> one record per GPU."""
    return gpus_from_samples(parse_prometheus_text(text), url)


def placeholder_gpu(url: str, host: str, status: Status, reason: str) -> ExporterGpu:
    """A stand-in for a source that gave no GPU at start: keeps it visible, with the reason."""
    missing = na(status, reason, EXPORTER_SOURCE)
    return ExporterGpu(
        url=url,
        host=host,
        info=GpuInfo(index=0, name=missing, uuid=missing),
        state=GpuState(timestamp=time.time(), gpu_util_pct=missing),
        activity=ActivityCounters.unavailable(status, reason),
        gpu_label=url,  # keeps the keys of two sources that both failed apart
    )


def missing_gpu(g: ExporterGpu, status: Status, reason: str, now: float) -> ExporterGpu:
    """``g`` with every state field and counter N/A for ``reason`` (its source failed)."""
    missing = na(status, reason, "")
    return ExporterGpu(
        url=g.url,
        host=g.host,
        info=g.info,
        state=GpuState(
            timestamp=now,
            **{
                f.name: missing
                for f in fields(GpuState)
                if f.name not in {"timestamp", "processes"}
            },
        ),
        activity=ActivityCounters.unavailable(status, reason),
        driver_version=g.driver_version,
        gpu_label=g.gpu_label,
        mig_id=g.mig_id,
    )


class GpuSetBackend:
    """A fixed set of GPUs found by a first read (of exporters or of Prometheus), then read
    again each tick; a GPU missing from a later read is N/A with the reason.

    Implements the probe ``Backend`` protocol plus ``activity()`` (the ``DCGM_FI_PROF_*``
    counters of the last ``sample()``, the same read) and ``hosts``. Subclasses say how the
    GPUs are found (``_find``) and read (``_read``).
    """

    is_recording = False
    label = "GPU set"

    def __init__(self) -> None:
        # When the last read was taken, where the source says (Prometheus: the evaluation
        # time); None: now.
        self.sample_time: float | None = None
        self._gpus: tuple[ExporterGpu, ...] | None = None
        self._last: dict[GpuKey, ExporterGpu] = {}
        self._first: tuple[dict[GpuKey, ExporterGpu], Callable[[ExporterGpu], Reading[Any]]] | None
        self._first = None

    def _find(
        self,
    ) -> tuple[
        tuple[ExporterGpu, ...], dict[GpuKey, ExporterGpu], Callable[[ExporterGpu], Reading[Any]]
    ]:
        """The GPUs of the first read (placeholders included), those with values, and for the
        others why they have none (a reading)."""
        raise NotImplementedError

    def _read(self) -> tuple[dict[GpuKey, ExporterGpu], Callable[[ExporterGpu], Reading[Any]]]:
        """One read: the GPUs found, by key, and for a GPU not found the reason (a reading)."""
        raise NotImplementedError

    def _discover(self) -> tuple[ExporterGpu, ...]:
        if self._gpus is None:
            gpus, found, why = self._find()
            self._gpus = gpus
            self._last = {g.key: g for g in gpus}
            self._first = (found, why)
        return self._gpus

    @property
    def gpus(self) -> tuple[ExporterGpu, ...]:
        """The GPUs found by the first read (with their host), in a stable order."""
        return self._discover()

    @property
    def hosts(self) -> tuple[str, ...]:
        """The node of each GPU (the exporter's ``Hostname`` label, else the URL's host)."""
        return tuple(g.host for g in self._discover())

    def gpu_count(self) -> Reading[int]:
        return ok(len(self._discover()), EXPORTER_SOURCE)

    def driver(self) -> DriverInfo:
        versions = sorted({g.driver_version for g in self._discover() if g.driver_version})
        if not versions:
            missing = _not_exported("DCGM_FI_DRIVER_VERSION label", self.label)
            return DriverInfo(driver_version=missing)
        text = versions[0] if len(versions) == 1 else "mixed: " + ", ".join(versions)
        return DriverInfo(driver_version=ok(text, EXPORTER_SOURCE))

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return tuple(g.info for g in self._discover())

    def states_of(
        self,
        found: Mapping[GpuKey, ExporterGpu],
        why: Callable[[ExporterGpu], Reading[Any]],
        now: float,
    ) -> tuple[tuple[GpuState, ...], tuple[ActivityCounters, ...]]:
        """States and counters of every GPU of the set from one read (N/A where missing)."""
        states: list[GpuState] = []
        counters: list[ActivityCounters] = []
        for g in self._discover():
            match = found.get(g.key)
            if match is None:
                reading = why(g)
                match = missing_gpu(g, reading.status, reading.reason, now)
            states.append(match.state)
            counters.append(match.activity)
        return tuple(states), tuple(counters)

    def sample(self) -> tuple[GpuState, ...]:
        gpus = self._discover()
        if self._first is not None:
            found, why = self._first  # the first tick reuses the discovery read
            self._first = None
        else:
            found, why = self._read()
        states, _ = self.states_of(found, why, time.time())
        latest: dict[GpuKey, ExporterGpu] = {}
        for g, state in zip(gpus, states, strict=True):
            latest[g.key] = found.get(g.key) or missing_gpu(
                g,
                state.gpu_util_pct.status,
                state.gpu_util_pct.reason,
                state.timestamp,
            )
        self._last = latest
        return states

    def activity(self) -> tuple[ActivityCounters, ...]:
        """Counters from the last ``sample()`` (the same read: one timestamp per tick)."""
        return tuple(self._last[g.key].activity for g in self._discover())

    def close(self) -> None:
        return None


Fetch = Callable[[str], Reading[str]]


class DcgmExporterBackend(GpuSetBackend):
    """GPUs of one or many dcgm-exporter endpoints as one backend (a cluster in one notebook).

    Endpoints are scraped in parallel, each within ``timeout_s`` overall; a failed endpoint
    makes its GPUs N/A with the reason and the rest carry on. The GPU list is fixed by the
    first scrape. dcgm-exporter refreshes its values every 30 s by default (``-c``
    milliseconds), so sampling faster than that repeats values.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 2.0,
        fetch: Fetch | None = None,
        max_workers: int = 8,
    ) -> None:
        super().__init__()
        if not urls:
            raise ArgumentError("give at least one dcgm-exporter URL (http://HOST:9400/metrics)")
        self.urls = tuple(normalize_exporter_url(u) for u in urls)
        self.timeout_s = timeout_s
        self._fetch: Fetch = fetch or (lambda u: scrape(u, timeout_s=timeout_s))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(max_workers, len(self.urls))),
            thread_name_prefix="gpudiag-exporter",
        )
        self._down: dict[str, str] = {}
        self._origin: dict[GpuKey, str] = {}
        hosts = ", ".join(urllib.parse.urlsplit(u).netloc for u in self.urls)
        self.label = f"dcgm-exporter: {hosts}"

    def _scrape_all(self) -> tuple[dict[str, tuple[ExporterGpu, ...]], dict[str, Reading[Any]]]:
        results = list(self._pool.map(self._fetch, self.urls))
        found: dict[str, tuple[ExporterGpu, ...]] = {}
        failed: dict[str, Reading[Any]] = {}
        for url, text in zip(self.urls, results, strict=False):
            if not text.ok:
                failed[url] = text
                continue
            try:
                found[url] = parse_exporter_text(str(text.value), url)
            except PrometheusParseError as exc:
                failed[url] = na(Status.UNKNOWN, f"{url} is not Prometheus text: {exc}", "")
        return found, failed

    def _why(self, failed: Mapping[str, Reading[Any]]) -> Callable[[ExporterGpu], Reading[Any]]:
        def why(g: ExporterGpu) -> Reading[Any]:
            url = self._origin.get(g.key, g.url)
            if url in self._down:
                return na(Status.NOT_FOUND, self._down[url], "")
            if url in failed:
                return failed[url]
            return na(Status.GPU_LOST, f"GPU {g.info.uuid.get('?')} is gone from {url}", "")

        return why

    def _find(
        self,
    ) -> tuple[
        tuple[ExporterGpu, ...], dict[GpuKey, ExporterGpu], Callable[[ExporterGpu], Reading[Any]]
    ]:
        found, failed = self._scrape_all()
        gpus: list[ExporterGpu] = []
        by_key: dict[GpuKey, ExporterGpu] = {}
        for url in self.urls:
            if url in found:
                for g in found[url]:
                    self._origin[g.key] = url
                    by_key[g.key] = g
                    gpus.append(g)
            else:
                # A placeholder keeps the endpoint visible, with why it has no data.
                reason = failed[url].reason + " (restart the monitor once it is up)"
                self._down[url] = reason
                host = urllib.parse.urlsplit(url).hostname or url
                g = placeholder_gpu(url, host, failed[url].status, reason)
                self._origin[g.key] = url
                gpus.append(g)
        return tuple(gpus), by_key, self._why(failed)

    def _read(self) -> tuple[dict[GpuKey, ExporterGpu], Callable[[ExporterGpu], Reading[Any]]]:
        found, failed = self._scrape_all()
        by_key: dict[GpuKey, ExporterGpu] = {}
        for url, gpus in found.items():
            for g in gpus:
                if self._origin.get(g.key) == url:
                    by_key[g.key] = g
        return by_key, self._why(failed)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# -- DCGM host engine (pydcgm) ------------------------------------------------------------

DCGM_SOURCE = "dcgm"

# field name -> (ActivityCounters attribute, scale, DCGM field id when the bindings lack it)
_PROF_FIELDS: tuple[tuple[str, str, float, int], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active_pct", 100.0, 1001),
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active_pct", 100.0, 1002),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_pct", 100.0, 1003),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_pct", 100.0, 1004),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active_pct", 100.0, 1005),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_s", 1.0, 1011),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_s", 1.0, 1012),
)

# DCGM_ST_* name -> (status, reason). Looked up by name in the loaded bindings.
_DCGM_ERRORS: dict[str, tuple[Status, str]] = {
    "DCGM_ST_REQUIRES_ROOT": (Status.NO_PERMISSION, PROFILING_PERMISSION_FIX),
    "DCGM_ST_NO_PERMISSION": (Status.NO_PERMISSION, PROFILING_PERMISSION_FIX),
    "DCGM_ST_PROFILING_NOT_SUPPORTED": (
        Status.NOT_SUPPORTED,
        "DCGM profiling fields are not supported on this GPU (they need a data-center GPU, "
        "Volta or newer, and are absent in vGPU guests)",
    ),
    "DCGM_ST_IN_USE": (
        Status.UNKNOWN,
        "the performance counters are in use by another profiler (Nsight Systems/Compute, "
        "CUPTI): stop it, or pause DCGM profiling with `dcgmi profile --pause` while it runs",
    ),
    "DCGM_ST_CONNECTION_NOT_VALID": (
        Status.NOT_FOUND,
        "no DCGM host engine answers: start it (`sudo systemctl start nvidia-dcgm` or "
        "`nv-hostengine`)",
    ),
    "DCGM_ST_INSUFFICIENT_DRIVER_VERSION": (
        Status.DRIVER_TOO_OLD,
        "the NVIDIA driver is too old for DCGM profiling fields: update the driver",
    ),
    "DCGM_ST_MODULE_NOT_LOADED": (
        Status.NOT_SUPPORTED,
        "the DCGM profiling module is not loaded (install the datacenter-gpu-manager package "
        "that matches the driver's CUDA major version)",
    ),
    "DCGM_ST_GPU_IS_LOST": (Status.GPU_LOST, "GPU is lost: check `dmesg` for Xid 79"),
    "DCGM_ST_LIBRARY_NOT_FOUND": (
        Status.NOT_FOUND,
        "libdcgm.so not found: install DCGM (datacenter-gpu-manager)",
    ),
}


def _dcgm_error_reading(structs: ModuleType, exc: BaseException) -> Reading[Any]:
    code = getattr(exc, "value", None)
    for name, (status, reason) in _DCGM_ERRORS.items():
        if code is not None and getattr(structs, name, object()) == code:
            return na(status, reason, DCGM_SOURCE)
    return na(Status.UNKNOWN, f"DCGM error: {exc}", DCGM_SOURCE)


def load_dcgm_bindings(
    importer: Callable[[str], ModuleType] = importlib.import_module,
    bindings_dir: str = DCGM_BINDINGS_DIR,
) -> Reading[tuple[ModuleType, ModuleType, ModuleType]]:
    """Import ``pydcgm``, ``dcgm_fields``, ``dcgm_structs``; N/A with the reason when absent.

    DCGM installs its bindings outside site-packages; when the import fails and DCGM's
    documented directory exists, it is appended to ``sys.path`` and the import retried.
    """

    def _import() -> tuple[ModuleType, ModuleType, ModuleType]:
        return importer("pydcgm"), importer("dcgm_fields"), importer("dcgm_structs")

    try:
        return ok(_import(), DCGM_SOURCE)
    except ImportError as first_error:
        if os.path.isdir(bindings_dir) and bindings_dir not in sys.path:
            sys.path.append(bindings_dir)
            try:
                return ok(_import(), DCGM_SOURCE)
            except ImportError:
                pass
        return na(
            Status.NOT_FOUND,
            f"DCGM Python bindings not found ({first_error}): install DCGM "
            f"(datacenter-gpu-manager) and add {bindings_dir} to PYTHONPATH",
            DCGM_SOURCE,
        )
    except Exception as exc:  # a broken install can raise anything at import
        return na(Status.UNKNOWN, f"DCGM bindings failed to import: {exc}", DCGM_SOURCE)


def _uuid_key(uuid: object) -> str:
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


class DcgmReader:
    """Watches the ``DCGM_FI_PROF_*`` fields on a DCGM host engine and reads the latest values.

    Untested on a real DCGM install: written against DCGM's Python bindings
    (``pydcgm.DcgmHandle``/``DcgmFieldGroup``, ``group.samples.WatchFields``/``GetLatest``)
    and tested with an import-level fake that follows them.
    """

    label = "DCGM"

    def __init__(
        self,
        modules: tuple[ModuleType, ModuleType, ModuleType],
        handle: Any,
        group: Any,
        field_group: Any,
        field_ids: dict[int, tuple[str, float]],
        uuids: dict[int, str],
    ) -> None:
        self._pydcgm, self._fields, self._structs = modules
        self._handle = handle
        self._group = group
        self._field_group = field_group
        self._field_ids = field_ids
        self._uuids = uuids
        self._closed = False

    @classmethod
    def connect(
        cls,
        host: str = "localhost",
        *,
        update_interval_s: float = 0.1,
        modules: tuple[ModuleType, ModuleType, ModuleType] | None = None,
    ) -> Reading[DcgmReader]:
        """Connect to the host engine at ``host`` and watch the profiling fields.

        N/A with the reason (and the fix) when the bindings are missing, no host engine
        answers, the counters need root, or the GPU cannot be profiled.
        """
        if modules is None:
            loaded = load_dcgm_bindings()
            if not loaded.ok or loaded.value is None:
                return na(loaded.status, loaded.reason, DCGM_SOURCE)
            modules = loaded.value
        pydcgm, dcgm_fields, dcgm_structs = modules
        error_type: type[BaseException] = getattr(dcgm_structs, "DCGMError", Exception)
        handle = None
        try:
            handle = pydcgm.DcgmHandle(ipAddress=host, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO)
            system = handle.GetSystem()
            group = system.GetDefaultGroup()
            gpu_ids = list(group.GetGpuIds())
            uuids = {
                int(g): str(system.discovery.GetGpuAttributes(g).identifiers.uuid) for g in gpu_ids
            }
            field_ids = {
                int(getattr(dcgm_fields, name, fallback)): (attr, scale)
                for name, attr, scale, fallback in _PROF_FIELDS
            }
            field_group = pydcgm.DcgmFieldGroup(
                handle, name=f"gpudiag_monitor_{os.getpid()}", fieldIds=list(field_ids)
            )
            # Keep two samples: only the latest is read, the other absorbs update jitter.
            group.samples.WatchFields(field_group, int(update_interval_s * 1e6), 10.0, 2)
        except error_type as exc:
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.Shutdown()
            reading = _dcgm_error_reading(dcgm_structs, exc)
            if reading.status is Status.NOT_FOUND and "host engine" in reading.reason:
                reading = na(reading.status, f"{reading.reason} (tried {host})", DCGM_SOURCE)
            return reading
        return ok(cls(modules, handle, group, field_group, field_ids, uuids), DCGM_SOURCE)

    @property
    def uuids(self) -> dict[int, str]:
        """DCGM GPU id -> UUID (DCGM ids need not match NVML indices: match by UUID)."""
        return dict(self._uuids)

    def read(self) -> dict[str, ActivityCounters]:
        """Latest counters per GPU, keyed by the UUID without its ``GPU-`` prefix, lower case."""
        error_type: type[BaseException] = getattr(self._structs, "DCGMError", Exception)
        try:
            latest = self._group.samples.GetLatest(self._field_group).values
        except error_type as exc:
            reading = _dcgm_error_reading(self._structs, exc)
            return {
                _uuid_key(u): ActivityCounters.unavailable(
                    reading.status, reading.reason, DCGM_SOURCE
                )
                for u in self._uuids.values()
            }
        out: dict[str, ActivityCounters] = {}
        for gpu_id, uuid in self._uuids.items():
            per_field = latest.get(gpu_id, {}) if hasattr(latest, "get") else {}
            readings: dict[str, Reading[float]] = {}
            for field_id, (attr, scale) in self._field_ids.items():
                series = per_field.get(field_id) if hasattr(per_field, "get") else None
                value = series[-1] if series is not None and len(series) else None
                if value is None or getattr(value, "isBlank", False):
                    readings[attr] = na(
                        Status.NOT_AVAILABLE,
                        "DCGM has no value yet (blank): the field may be unsupported on this "
                        "GPU, or the first update has not happened",
                        DCGM_SOURCE,
                    )
                else:
                    readings[attr] = ok(float(value.value) * scale, DCGM_SOURCE)
            out[_uuid_key(uuid)] = ActivityCounters(**readings)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._group.samples.UnwatchFields(self._field_group)
        with contextlib.suppress(Exception):
            self._field_group.Delete()
        with contextlib.suppress(Exception):
            self._handle.Shutdown()


__all__ = [
    "DCGM_BINDINGS_DIR",
    "PROFILING_PERMISSION_FIX",
    "ActivityCounters",
    "DcgmExporterBackend",
    "DcgmReader",
    "ExporterGpu",
    "GpuSetBackend",
    "PromSample",
    "PrometheusParseError",
    "ascii_int",
    "gpus_from_samples",
    "load_dcgm_bindings",
    "normalize_exporter_url",
    "parse_exporter_text",
    "parse_prometheus_text",
    "scrape",
]
