"""DCGM: the Prometheus parser on real dcgm-exporter scrapes, scraping over HTTP (a cluster of
exporters), and the host-engine reader against an import-level fake of DCGM's bindings."""

from __future__ import annotations

import http.server
import math
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import ExporterCounters, GpuFeed
from gpudiag.probe.dcgm import (
    PROFILING_PERMISSION_FIX,
    DcgmExporterBackend,
    DcgmReader,
    PrometheusParseError,
    load_dcgm_bindings,
    normalize_exporter_url,
    parse_exporter_text,
    parse_prometheus_text,
    scrape,
)
from gpudiag.probe.readings import Status

MIB = 1 << 20


def prom(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "dcgm-exporter" / name).read_text()


# -- the parser ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "samples"),
    [("kops-aws-l4.prom", 23), ("upcloud-l40s.prom", 23), ("vks-grid-a100-10c.prom", 11)],
)
def test_real_scrapes_parse(fixtures_dir: Path, name: str, samples: int) -> None:
    parsed = parse_prometheus_text(prom(fixtures_dir, name))
    assert len(parsed) == samples  # the counts SOURCES.md gives
    assert all(s.name.startswith("DCGM_FI_") for s in parsed)
    assert all("UUID" in s.labels for s in parsed)


def test_labels_escapes_special_values_and_timestamps() -> None:
    text = (
        "# HELP x a metric\n"
        "# TYPE x gauge\n"
        'x{a="q\\"uote",b="back\\\\slash",c="new\\nline",} 1.5 1700000000000\n'
        "y NaN\n"
        "z{} +Inf\n"
        "\n"
        "w -3e2\n"
    )
    x, y, z, w = parse_prometheus_text(text)
    assert dict(x.labels) == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert (x.value, x.timestamp_ms) == (1.5, 1700000000000)
    assert math.isnan(y.value)
    assert z.value == math.inf
    assert w.value == -300.0


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('ok 1\nbad{a="1" 2\n', 2),
        ("ok 1\n\nnovalue\n", 3),
        ('x{1a="b"} 1\n', 1),
        ("x one\n", 1),
        ('x{a="open} 1\n', 1),
    ],
)
def test_malformed_lines_are_named(text: str, line: int) -> None:
    with pytest.raises(PrometheusParseError, match=f"line {line}"):
        parse_prometheus_text(text)


def test_l4_scrape_to_probe_records(fixtures_dir: Path) -> None:
    (gpu,) = parse_exporter_text(prom(fixtures_dir, "kops-aws-l4.prom"), "http://node:9400/metrics")
    assert gpu.host == "i-030791dc5a37cd257"
    assert gpu.info.name.value == "NVIDIA L4"
    assert gpu.info.uuid.value == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert gpu.info.memory_total_bytes.value == (22563 + 0 + 470) * MIB
    assert gpu.driver_version == "580.105.08"
    assert gpu.state.power_w.value == 16.365
    assert gpu.state.sm_clock_mhz.value == 210
    assert gpu.state.pcie_tx_bytes_per_s.value == 112603.0
    assert gpu.activity.tensor_active_pct.value == 0.0
    # Not in dcgm-exporter's default counter list: says so, and how to add it.
    assert gpu.activity.sm_active_pct.status is Status.NOT_AVAILABLE
    assert "-f" in gpu.activity.sm_active_pct.reason


def test_l40s_dram_active_ratio_becomes_percent(fixtures_dir: Path) -> None:
    (gpu,) = parse_exporter_text(prom(fixtures_dir, "upcloud-l40s.prom"))
    assert gpu.activity.dram_active_pct.value == pytest.approx(0.0131)


def test_vgpu_reduced_metric_set_is_na_with_reasons(fixtures_dir: Path) -> None:
    (gpu,) = parse_exporter_text(prom(fixtures_dir, "vks-grid-a100-10c.prom"), "vks")
    assert gpu.info.name.value == "GRID A100-10C"
    assert not gpu.state.power_w.ok
    assert "DCGM_FI_DEV_POWER_USAGE is not exported by vks" in gpu.state.power_w.reason
    assert not gpu.activity.dram_active_pct.ok


def test_exporter_urls_are_normalised() -> None:
    assert normalize_exporter_url("node1:9400") == "http://node1:9400/metrics"
    assert normalize_exporter_url("https://n/metrics") == "https://n/metrics"
    assert normalize_exporter_url("http://n:9400/custom") == "http://n:9400/custom"


# -- scraping a cluster over HTTP ------------------------------------------------------------


class _Exporter(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[int, str, float]]] = {}

    def do_GET(self) -> None:
        status, body, delay_s = self.pages.get(self.path, (404, "not found", 0.0))
        if delay_s:
            time.sleep(delay_s)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def exporter_server(fixtures_dir: Path) -> Iterator[str]:
    _Exporter.pages = {
        "/l4/metrics": (200, prom(fixtures_dir, "kops-aws-l4.prom"), 0.0),
        "/l40s/metrics": (200, prom(fixtures_dir, "upcloud-l40s.prom"), 0.0),
        "/broken/metrics": (500, "internal error", 0.0),
        "/slow/metrics": (200, prom(fixtures_dir, "kops-aws-l4.prom"), 1.0),
        "/garbage/metrics": (200, "this is { not prometheus\n", 0.0),
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_scrape_failures_are_readings_with_reasons(exporter_server: str) -> None:
    assert scrape(f"{exporter_server}/l4/metrics").ok
    broken = scrape(f"{exporter_server}/broken/metrics")
    assert "HTTP 500" in broken.reason
    slow = scrape(f"{exporter_server}/slow/metrics", timeout_s=0.2)
    assert "did not answer in 0.2 s" in slow.reason
    down = scrape(f"http://127.0.0.1:{free_port()}/metrics", timeout_s=1.0)
    assert down.status is Status.NOT_FOUND
    assert "is dcgm-exporter running" in down.reason


def test_a_cluster_of_exporters_in_one_monitor(exporter_server: str) -> None:
    backend = DcgmExporterBackend(
        [f"{exporter_server}/l4/metrics", f"{exporter_server}/l40s/metrics"], timeout_s=2.0
    )
    feed = GpuFeed(backend, counters=ExporterCounters(backend))
    assert [d.id for d in feed.devices] == ["i-030791dc5a37cd257/gpu0", "gpu1-wl8sg/gpu0"]
    m = Monitor(feed, interval=1.0, start=False)
    m.tick()
    m.tick()
    df = m.samples()
    assert df[("gpu1-wl8sg/gpu0", "power_w")].tolist() == [35.686, 35.686]
    assert df[("gpu1-wl8sg/gpu0", "dram_active_pct")].iloc[-1] == pytest.approx(0.0131)
    m.stop()


def test_an_exporter_down_keeps_a_tile_that_says_why(exporter_server: str) -> None:
    down = f"http://127.0.0.1:{free_port()}/metrics"
    backend = DcgmExporterBackend(
        [f"{exporter_server}/l4/metrics", down, f"{exporter_server}/garbage/metrics"],
        timeout_s=1.0,
    )
    feed = GpuFeed(backend, counters=ExporterCounters(backend))
    assert len(feed.devices) == 3
    frame = feed.read()
    width = len(feed.metrics)  # the GPU metrics and, from an exporter, its error counts
    util = feed.metrics.index("gpu_util_pct")
    assert frame.values[util] == 0.0  # the L4 carries on
    assert "cannot reach" in frame.na[width + util][1]
    assert "not Prometheus text" in frame.na[2 * width + util][1]
    feed.close()


def test_a_gpu_that_vanishes_from_its_exporter_goes_na(
    exporter_server: str, fixtures_dir: Path
) -> None:
    url = f"{exporter_server}/l4/metrics"
    backend = DcgmExporterBackend([url])
    backend.sample()
    _Exporter.pages["/l4/metrics"] = (200, prom(fixtures_dir, "upcloud-l40s.prom"), 0.0)
    (state,) = backend.sample()
    assert state.gpu_util_pct.status is Status.GPU_LOST
    assert "is gone from" in state.gpu_util_pct.reason
    backend.close()


# -- the DCGM host engine through its Python bindings (an import-level fake) ------------------


def fake_dcgm(
    *,
    watch_error: str | None = None,
    connect_error: str | None = None,
    values: dict[int, dict[int, float | None]] | None = None,
) -> tuple[types.ModuleType, types.ModuleType, types.ModuleType, dict[str, Any]]:
    """``pydcgm``, ``dcgm_fields``, ``dcgm_structs`` as DCGM's Python bindings define them."""
    log: dict[str, Any] = {"watched": None, "unwatched": 0, "deleted": 0, "shutdown": 0}
    structs = types.ModuleType("dcgm_structs")
    codes = {
        "DCGM_ST_OK": 0,
        "DCGM_ST_NOT_SUPPORTED": -6,
        "DCGM_ST_NO_PERMISSION": -17,
        "DCGM_ST_CONNECTION_NOT_VALID": -21,
        "DCGM_ST_REQUIRES_ROOT": -29,
        "DCGM_ST_IN_USE": -34,
        "DCGM_ST_PROFILING_NOT_SUPPORTED": -36,
    }
    for name, code in codes.items():
        setattr(structs, name, code)
    structs.DCGM_OPERATION_MODE_AUTO = 1  # type: ignore[attr-defined]

    class DCGMError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"DCGM error {value}")
            self.value = value

    structs.DCGMError = DCGMError  # type: ignore[attr-defined]

    fields_mod = types.ModuleType("dcgm_fields")
    ids = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
        "DCGM_FI_PROF_SM_ACTIVE": 1002,
        "DCGM_FI_PROF_SM_OCCUPANCY": 1003,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
        "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 1011,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 1012,
    }
    for name, fid in ids.items():
        setattr(fields_mod, name, fid)

    class Value:
        def __init__(self, value: float | None) -> None:
            self.value = value if value is not None else 0.0
            self.isBlank = value is None
            self.ts = 0

    class Samples:
        def WatchFields(self, group: Any, freq_us: int, age_s: float, keep: int) -> None:
            if watch_error:
                raise DCGMError(codes[watch_error])
            log["watched"] = (list(group.fieldIds), freq_us, age_s, keep)

        def UnwatchFields(self, group: Any) -> None:
            log["unwatched"] += 1

        def GetLatest(self, group: Any) -> Any:
            table = values or {}
            return types.SimpleNamespace(
                values={
                    gpu: {fid: [Value(v)] for fid, v in per.items()} for gpu, per in table.items()
                }
            )

    class Group:
        samples = Samples()

        def GetGpuIds(self) -> list[int]:
            return [0, 1]

    class System:
        discovery = types.SimpleNamespace(
            GetGpuAttributes=lambda gpu: types.SimpleNamespace(
                identifiers=types.SimpleNamespace(uuid=f"GPU-0000000{gpu}-aaaa")
            )
        )

        def GetDefaultGroup(self) -> Group:
            return Group()

    class DcgmHandle:
        def __init__(self, handle: Any = None, ipAddress: Any = None, opMode: int = 1) -> None:
            if connect_error:
                raise DCGMError(codes[connect_error])
            log["address"] = ipAddress

        def GetSystem(self) -> System:
            return System()

        def Shutdown(self) -> None:
            log["shutdown"] += 1

    class DcgmFieldGroup:
        def __init__(self, handle: Any, name: str = "", fieldIds: Any = None) -> None:
            self.name = name
            self.fieldIds = fieldIds or []

        def Delete(self) -> None:
            log["deleted"] += 1

    pydcgm = types.ModuleType("pydcgm")
    pydcgm.DcgmHandle = DcgmHandle  # type: ignore[attr-defined]
    pydcgm.DcgmFieldGroup = DcgmFieldGroup  # type: ignore[attr-defined]
    return pydcgm, fields_mod, structs, log


def test_dcgm_reader_watches_the_profiling_fields_and_reads_them() -> None:
    pydcgm, fields_mod, structs, log = fake_dcgm(
        values={0: {1002: 0.875, 1004: 0.5, 1005: 0.25, 1003: None}, 1: {}}
    )
    reading = DcgmReader.connect("10.0.0.5", modules=(pydcgm, fields_mod, structs))
    assert reading.ok
    reader = reading.value
    assert reader is not None
    assert log["address"] == "10.0.0.5"
    watched_ids, freq_us, _age, keep = log["watched"]
    assert sorted(watched_ids) == [1001, 1002, 1003, 1004, 1005, 1011, 1012]
    assert (freq_us, keep) == (100_000, 2)
    latest = reader.read()
    gpu0 = latest["00000000-aaaa"]
    assert gpu0.sm_active_pct.value == 87.5
    assert gpu0.tensor_active_pct.value == 50.0
    assert gpu0.dram_active_pct.value == 25.0
    assert "blank" in gpu0.sm_occupancy_pct.reason
    assert not latest["00000001-aaaa"].sm_active_pct.ok
    reader.close()
    reader.close()
    assert (log["unwatched"], log["deleted"], log["shutdown"]) == (1, 1, 1)


def test_dcgm_counters_not_permitted_say_how_to_fix_it() -> None:
    modules = fake_dcgm(watch_error="DCGM_ST_REQUIRES_ROOT")
    reading = DcgmReader.connect(modules=modules[:3])
    assert reading.status is Status.NO_PERMISSION
    assert reading.reason == PROFILING_PERMISSION_FIX
    assert modules[3]["shutdown"] == 1  # the half-open connection is released


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        ("DCGM_ST_CONNECTION_NOT_VALID", Status.NOT_FOUND, "no DCGM host engine"),
        ("DCGM_ST_PROFILING_NOT_SUPPORTED", Status.NOT_SUPPORTED, "not supported on this GPU"),
        ("DCGM_ST_IN_USE", Status.UNKNOWN, "another profiler"),
    ],
)
def test_dcgm_failures_map_to_statuses(error: str, status: Status, words: str) -> None:
    is_connect = error == "DCGM_ST_CONNECTION_NOT_VALID"
    modules = fake_dcgm(
        connect_error=error if is_connect else None, watch_error=None if is_connect else error
    )
    reading = DcgmReader.connect(modules=modules[:3])
    assert reading.status is status
    assert words in reading.reason


def test_missing_dcgm_bindings_say_where_they_live(tmp_path: Path) -> None:
    def importer(name: str) -> types.ModuleType:
        raise ImportError(f"No module named {name!r}")

    reading = load_dcgm_bindings(importer, bindings_dir=str(tmp_path / "absent"))
    assert reading.status is Status.NOT_FOUND
    assert "PYTHONPATH" in reading.reason
