"""Every node's GPUs through a Prometheus server: PromQL over its HTTP API for the DCGM fields.

Clusters that run NVIDIA's dcgm-exporter on each node usually have a Prometheus scraping them.
``PrometheusBackend`` asks that server (``/api/v1/query`` each tick, ``/api/v1/query_range``
for the history at start) for the ``DCGM_FI_*`` series that a label selector picks, and turns
each node's GPUs into the same probe records a dcgm-exporter scrape gives, so the monitor,
its widget and the rules read a cluster the way they read one machine.

Every request is bounded (``gpudiag.probe.netread``: an overall deadline and a byte cap) and
every answer is checked (msgspec decodes it into the API's documented shape; the number of
series and points is capped): a server that is down, slow or answers garbage makes the GPUs
N/A with the reason, never an exception. Check a number by hand with the query in
``backend.query`` (Prometheus's own web page, or ``curl URL/api/v1/query --data-urlencode
'query=...'``).
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gpudiag.errors import ArgumentError, PrometheusParseError
from gpudiag.probe.dcgm import (
    ActivityCounters,
    ExporterGpu,
    GpuKey,
    GpuSetBackend,
    PromSample,
    gpus_from_samples,
    node_of,
    placeholder_gpu,
)
from gpudiag.probe.model import GpuState
from gpudiag.probe.netread import http_get
from gpudiag.probe.readings import Reading, Status, na, ok

SOURCE = "prometheus"
_MIB = 1 << 20

# The DCGM fields read (dcgm-exporter's names). Fields an exporter does not export are N/A
# with that reason, as for a direct scrape.
DCGM_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)

# The labels that tell one GPU from another (dcgm-exporter's), kept by the per-tick query.
GPU_LABELS = ("Hostname", "instance", "gpu", "UUID", "GPU_I_ID")

MAX_SERIES = 100_000
MAX_POINTS = 2_000_000  # series x points of one range answer
MAX_SELECTOR_CHARS = 2000
RECENT_S = 300.0  # a GPU seen this recently gets a row even if its last scrape failed


# -- the API's answers (https://prometheus.io/docs/prometheus/latest/querying/api/) -----------


class _Series(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str] | None = None
    values: list[tuple[float, str]] | None = None


class _Data(msgspec.Struct):
    resultType: str
    result: msgspec.Raw  # decoded as series once resultType says it holds some


class _Answer(msgspec.Struct):
    status: str
    data: _Data | None = None
    errorType: str = ""
    error: str = ""
    warnings: list[str] = []


class _SeriesAnswer(msgspec.Struct):
    status: str
    data: list[dict[str, str]] = []
    error: str = ""


_DECODER = msgspec.json.Decoder(_Answer)
_LABELS_DECODER = msgspec.json.Decoder(_SeriesAnswer)
_SERIES_DECODER = msgspec.json.Decoder(list[_Series])


def _number(text: str) -> float:
    """A sample value as the API writes it ("1.5", "NaN", "+Inf"); NaN for anything else."""
    if not text.isascii():
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def _snippet(body: bytes) -> str:
    text = body[:120].decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()


class PrometheusClient:
    """Instant and range queries over Prometheus's HTTP API, each bounded and checked.

    Every method returns a ``Reading``: the series, or N/A with what went wrong (refused,
    too slow, an error the server named, an answer that is not the API's JSON, too large).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_bytes: int = 64 * _MIB,
        max_series: int = MAX_SERIES,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.url = normalize_prometheus_url(url)
        self.timeout_s = float(timeout_s)
        self.max_bytes = int(max_bytes)
        self.max_series = int(max_series)
        self.max_points = int(max_points)

    def _get(self, path: str, params: dict[str, str]) -> Reading[list[_Series]]:
        endpoint = self.url + path
        got = http_get(
            endpoint,
            params=params,
            timeout_s=self.timeout_s,
            max_bytes=self.max_bytes,
            accept="application/json",
            source=SOURCE,
        )
        if not got.ok or got.value is None:
            reason = got.reason
            if got.status is Status.NOT_FOUND:
                reason += ": is Prometheus running there?"
            return na(got.status, reason, SOURCE)
        answer = got.value
        try:
            decoded = _DECODER.decode(answer.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if answer.status != 200:
                return na(
                    Status.UNKNOWN,
                    f"{endpoint} answered HTTP {answer.status} {answer.reason}: "
                    f"{_snippet(answer.body)!r}",
                    SOURCE,
                )
            return na(
                Status.UNKNOWN,
                f"{endpoint} did not answer with Prometheus's API JSON ({exc}; it began "
                f"{_snippet(answer.body)!r}): is this URL a Prometheus server?",
                SOURCE,
            )
        if decoded.status != "success" or decoded.data is None:
            what = f"{decoded.errorType}: {decoded.error}" if decoded.error else decoded.status
            return na(Status.UNKNOWN, f"Prometheus refused the query ({what[:300]})", SOURCE)
        if decoded.data.resultType not in {"vector", "matrix"}:
            kind = decoded.data.resultType[:40]
            return na(Status.UNKNOWN, f"expected series, got a {kind} from {endpoint}", SOURCE)
        try:
            result = _SERIES_DECODER.decode(decoded.data.result)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return na(Status.UNKNOWN, f"{endpoint} answered series of another shape: {exc}", SOURCE)
        if len(result) > self.max_series:
            return na(
                Status.UNKNOWN,
                f"the answer holds {len(result)} series (more than max_series="
                f"{self.max_series}): narrow the selector",
                SOURCE,
            )
        points = sum(len(s.values or ()) for s in result)
        if points > self.max_points:
            return na(
                Status.UNKNOWN,
                f"the answer holds {points} points (more than max_points={self.max_points})",
                SOURCE,
            )
        return ok(result, SOURCE)

    def series(self, selector: str, start: float, end: float) -> Reading[list[dict[str, str]]]:
        """``/api/v1/series``: the label sets of the series ``selector`` picks that had a
        sample between ``start`` and ``end`` (a node whose last scrape failed still counts)."""
        got = http_get(
            self.url + "/api/v1/series",
            params={"match[]": selector, "start": f"{start:.3f}", "end": f"{end:.3f}"},
            timeout_s=self.timeout_s,
            max_bytes=self.max_bytes,
            accept="application/json",
            source=SOURCE,
        )
        if not got.ok or got.value is None:
            return na(got.status, got.reason, SOURCE)
        try:
            answer = _LABELS_DECODER.decode(got.value.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return na(Status.UNKNOWN, f"not Prometheus's series JSON: {exc}", SOURCE)
        if answer.status != "success":
            return na(Status.UNKNOWN, f"Prometheus refused ({answer.error[:300]})", SOURCE)
        if len(answer.data) > self.max_series:
            return na(Status.UNKNOWN, f"more than max_series={self.max_series} series", SOURCE)
        return ok(answer.data, SOURCE)

    def query(self, promql: str, at: float | None = None) -> Reading[list[_Series]]:
        """``/api/v1/query``: the value of each series at ``at`` (seconds since the epoch)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._get("/api/v1/query", params)

    def query_range(
        self, promql: str, start: float, end: float, step_s: float
    ) -> Reading[list[_Series]]:
        """``/api/v1/query_range``: values at ``start``, ``start + step_s``, ... ``end``."""
        params = {
            "query": promql,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        return self._get("/api/v1/query_range", params)


def normalize_prometheus_url(url: str) -> str:
    """``host:9090`` -> ``http://host:9090``; a trailing slash is dropped."""
    text = str(url).strip()
    if not text:
        raise ArgumentError("give the Prometheus server's URL, e.g. http://HOST:9090")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ArgumentError(f"not a Prometheus URL: {url!r} (expected http://HOST:9090)")
    return text.rstrip("/")


def selector_matchers(selector: str) -> str:
    """``'{job="dcgm"}'`` (or ``'job="dcgm"'``) -> ``'job="dcgm"'``: the label matchers that
    go inside the braces of every query. Refuses anything that is not one set of matchers."""
    text = str(selector).strip()
    if len(text) > MAX_SELECTOR_CHARS:
        raise ArgumentError(f"the selector is longer than {MAX_SELECTOR_CHARS} characters")
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if any(c in text for c in "{}()\n\r") or "__name__" in text:
        raise ArgumentError(
            f"selector {selector!r} is not a set of label matchers: write it as "
            '\'{job="dcgm"}\' or \'{namespace="gpu-operator", Hostname=~"node-.*"}\' (the '
            "DCGM field names are added by gpudiag)"
        )
    return text


def series_query(matchers: str, fields: Sequence[str] = DCGM_FIELDS) -> str:
    """The series of ``fields`` that ``matchers`` pick, every label kept."""
    names = "|".join(fields)
    return "{" + f'__name__=~"{names}"' + (f", {matchers}" if matchers else "") + "}"


def tick_query(matchers: str, fields: Sequence[str] = DCGM_FIELDS) -> str:
    """The per-tick query: one value per field and GPU, only the labels that tell GPUs apart
    (two scrape jobs of one exporter collapse into one series)."""
    return f"max by (__name__, {', '.join(GPU_LABELS)}) ({series_query(matchers, fields)})"


def _samples(series: Sequence[_Series]) -> list[PromSample]:
    out = []
    for s in series:
        name = s.metric.get("__name__", "")
        if s.value is not None:
            out.append(PromSample(name, s.metric, _number(s.value[1])))
    return out


Why = Callable[[ExporterGpu], Reading[Any]]


class PrometheusBackend(GpuSetBackend):
    """The GPUs that ``selector`` picks on a Prometheus server, one probe record per node/GPU.

    Found by one instant query at start; each ``sample()`` is one instant query evaluated
    ``lag_s`` before now (so that a scrape still in flight is not missed, and a row equals
    what Prometheus answers later for the same query and time); ``history()`` is range
    queries. ``sample_time`` is the evaluation time of the last read (the row's timestamp).
    """

    def __init__(
        self,
        url: str,
        selector: str = "",
        *,
        fields: Sequence[str] = DCGM_FIELDS,
        lag_s: float = 1.0,
        timeout_s: float = 5.0,
        max_series: int = MAX_SERIES,
        max_points: int = MAX_POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        if not (isinstance(lag_s, (int, float)) and math.isfinite(lag_s) and 0 <= lag_s <= 3600):
            raise ArgumentError(f"lag_s must be between 0 and 3600 seconds, not {lag_s!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ArgumentError(f"timeout_s must be a positive number, not {timeout_s!r}")
        self.client = PrometheusClient(
            url, timeout_s=timeout_s, max_series=max_series, max_points=max_points
        )
        self.url = self.client.url
        self.selector = selector
        self.matchers = selector_matchers(selector)
        self.series_query = series_query(self.matchers, fields)
        self.query = tick_query(self.matchers, fields)
        self.lag_s = float(lag_s)
        self._clock = clock
        self._placeholder = False  # no GPU found at start: a stand-in says why
        self._failure: Reading[Any] = na(Status.UNKNOWN, "")
        netloc = urllib.parse.urlsplit(self.url).netloc
        self.label = f"Prometheus {netloc}" + (f" {{{self.matchers}}}" if self.matchers else "")

    def _gpus_of(self, series: Reading[list[_Series]]) -> Reading[tuple[ExporterGpu, ...]]:
        if not series.ok or series.value is None:
            return na(series.status, series.reason, SOURCE)
        try:
            return ok(gpus_from_samples(_samples(series.value), self.url), SOURCE)
        except PrometheusParseError as exc:
            return na(Status.UNKNOWN, str(exc), SOURCE)

    def _stale(self, at: float) -> Why:
        # No time in the reason: a reason that stays the same while a GPU stays stale is one
        # change for the monitor to keep, not one per tick.
        def why(g: ExporterGpu) -> Reading[Any]:
            return na(
                Status.NOT_AVAILABLE,
                f"Prometheus has no recent sample of {g.host} GPU {g.gpu_label or '?'}: its "
                f"exporter is down or its series went stale (check up{{{self.matchers}}} on "
                "the server)",
                SOURCE,
            )

        return why

    def _no_match(self) -> str:
        hint = self.client.query('count by (job) ({__name__=~"DCGM_FI_DEV_GPU_UTIL"})')
        jobs = sorted(s.metric.get("job", "") for s in (hint.value or ()) if hint.ok)
        where = (
            "Prometheus holds DCGM_FI_DEV_GPU_UTIL under " + ", ".join(f'job="{j}"' for j in jobs)
            if jobs
            else "Prometheus holds no DCGM_FI_DEV_GPU_UTIL series at all (is dcgm-exporter "
            "among its scrape targets?)"
        )
        return f"no DCGM series match {{{self.matchers}}}: {where}"

    def _find(self) -> tuple[tuple[ExporterGpu, ...], dict[GpuKey, ExporterGpu], Why]:
        at = self._clock() - self.lag_s
        answer = self.client.query(self.series_query, at)
        found = self._gpus_of(answer)
        self.sample_time = at
        host = urllib.parse.urlsplit(self.url).netloc
        if found.ok and found.value:
            gpus = self._with_recent(answer.value or [], found.value, at)
            return gpus, {g.key: g for g in found.value}, self._stale(at)
        self._placeholder = True
        if not found.ok or found.value is None:
            failure = na(found.status, found.reason + " (restart the monitor once it answers)")
        else:
            failure = na(Status.NOT_FOUND, self._no_match() + " (restart the monitor once it does)")
        self._failure = failure
        g = placeholder_gpu(self.url, host, failure.status, failure.reason)
        return (g,), {}, lambda _g: failure

    def _with_recent(
        self, now: list[_Series], found: tuple[ExporterGpu, ...], at: float
    ) -> tuple[ExporterGpu, ...]:
        """``found`` plus the GPUs with a sample in the last ``RECENT_S`` but none now (their
        node's last scrape failed): they get a row, N/A until they answer again."""
        recent = self.client.series(self.series_query, at - RECENT_S, at)
        if not recent.ok or not recent.value:
            return found
        known = {g.key for g in found}
        samples = _samples(now)
        for labels in recent.value:
            key = (
                node_of(labels, self.url),
                labels.get("UUID", ""),
                labels.get("gpu", ""),
                labels.get("GPU_I_ID", ""),
            )
            if key not in known:  # values only say which fields it had: N/A until it answers
                samples.append(PromSample(labels.get("__name__", ""), labels, math.nan))
        try:
            every = gpus_from_samples(samples, self.url)
        except PrometheusParseError:
            return found
        return every if len(every) > len(found) else found

    def _read(self) -> tuple[dict[GpuKey, ExporterGpu], Why]:
        at = self._clock() - self.lag_s
        answer = self.client.query(self.query, at)
        self.sample_time = at
        if self._placeholder:  # the GPU list was fixed empty at start
            if answer.ok:
                failure = na(
                    Status.NOT_AVAILABLE,
                    "Prometheus answers now: restart the monitor to read its GPUs "
                    f"(at start: {self._failure.reason})",
                )
            else:
                failure = na(
                    answer.status, answer.reason + " (restart the monitor once it answers)"
                )
            return {}, lambda _g: failure
        found = self._gpus_of(answer)
        if not found.ok or found.value is None:
            failure = na(found.status, found.reason, SOURCE)
            return {}, lambda _g: failure
        return {g.key: g for g in found.value}, self._stale(at)

    def history(
        self, span_s: float, step_s: float
    ) -> Reading[list[tuple[float, tuple[GpuState, ...], tuple[ActivityCounters, ...]]]]:
        """The last ``span_s`` seconds at ``step_s`` resolution (range queries), one entry per
        step: (time, states, counters). Shortened so that GPUs x fields x steps stays under
        the client's point cap."""
        gpus = self._discover()
        if self._placeholder:
            return ok([], SOURCE)
        end = self._clock() - self.lag_s
        width = max(1, len(gpus) * len(DCGM_FIELDS))
        steps = int(min(span_s / step_s, self.client.max_points // width, 11_000))
        if steps < 1:
            return ok([], SOURCE)
        start = end - steps * step_s
        answer = self.client.query_range(self.query, start, end, step_s)
        if not answer.ok or answer.value is None:
            return na(answer.status, answer.reason, SOURCE)
        per_time: dict[float, list[PromSample]] = {}
        for s in answer.value:
            name = s.metric.get("__name__", "")
            for t, text in s.values or ():
                per_time.setdefault(round(float(t), 3), []).append(
                    PromSample(name, s.metric, _number(text))
                )
        out = []
        for t in sorted(per_time):
            try:
                found = gpus_from_samples(per_time[t], self.url)
            except PrometheusParseError as exc:
                return na(Status.UNKNOWN, str(exc), SOURCE)
            states, counters = self.states_of({g.key: g for g in found}, self._stale(t), t)
            out.append((t, states, counters))
        return ok(out, SOURCE)


__all__ = [
    "DCGM_FIELDS",
    "GPU_LABELS",
    "PrometheusBackend",
    "PrometheusClient",
    "normalize_prometheus_url",
    "selector_matchers",
    "series_query",
    "tick_query",
]
