"""A Prometheus or an exporter that is down, slow, trickling or answering garbage: N/A with the
reason, within the deadline, never a traceback or a frozen monitor.

The servers here are scripted (no Prometheus binary): a fake of Prometheus's query API that
answers the documented JSON built from the recorded L4 scrape, then switches to failing.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import gpudiag as gd
from gpudiag.errors import ArgumentError
from gpudiag.monitoring import Monitor
from gpudiag.monitoring.feeds import GpuFeed
from gpudiag.probe.dcgm import (
    DcgmExporterBackend,
    PrometheusParseError,
    parse_exporter_text,
    parse_prometheus_text,
    scrape,
)
from gpudiag.probe.netread import http_get
from gpudiag.probe.prometheus import PrometheusBackend, PrometheusClient
from gpudiag.probe.readings import Status
from tests.conftest import FIXTURES
from tests.fakes.cluster import free_port

L4 = (FIXTURES / "dcgm-exporter" / "kops-aws-l4.prom").read_text()


def _api_vector() -> bytes:
    """The L4 scrape as Prometheus's /api/v1/query answer (every label kept, as it stores)."""
    now = time.time()
    result = [
        {
            "metric": {"__name__": s.name, **s.labels, "instance": "node:9400", "job": "dcgm"},
            "value": [now, repr(s.value)],
        }
        for s in parse_prometheus_text(L4)
    ]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


class _Server(http.server.BaseHTTPRequestHandler):
    mode: ClassVar[str] = "ok"
    body: ClassVar[bytes] = b""

    def do_GET(self) -> None:
        mode = type(self).mode
        if mode == "slowloris":  # headers, then one byte at a time for ever
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
            return
        if mode == "slow":
            time.sleep(3.0)
        if mode == "garbage":
            status, body = 200, b"<html><body>Grafana login</body></html>"
        elif mode == "error":
            status, body = 400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'
        elif mode == "scalar":
            status, body = (
                200,
                b'{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}',
            )
        else:
            status, body = 200, type(self).body
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            return

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Server]]]:
    handler = type("Handler", (_Server,), {"mode": "ok", "body": _api_vector()})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def _tick_reason(m: Monitor) -> str:
    m.tick()
    reasons = {reason for _, reason in m.na_index().values()}
    (util,) = [i for i, s in enumerate(m.series) if s.metric == "gpu_util_pct"]
    return m.na_index()[util][1] if util in m.na_index() else f"ok ({len(reasons)} N/A)"


def test_a_prometheus_that_turns_bad_mid_run_gives_reasons_not_tracebacks(
    server: tuple[str, type[_Server]],
) -> None:
    url, handler = server
    backend = PrometheusBackend(url, '{job="dcgm"}', lag_s=0.0, timeout_s=0.5)
    m = Monitor(GpuFeed(backend), interval=1.0, start=False)
    assert [d.id for d in m.devices] == ["gpu0"]  # one node: no host prefix
    assert _tick_reason(m).startswith("ok")
    handler.mode = "garbage"
    assert "did not answer with Prometheus's API JSON" in _tick_reason(m)
    handler.mode = "error"
    assert "Prometheus refused the query (bad_data: parse error)" in _tick_reason(m)
    handler.mode = "scalar"
    assert "expected series, got a scalar from" in _tick_reason(m)
    handler.mode = "slow"
    started = time.monotonic()
    assert "did not answer in 0.5 s" in _tick_reason(m)
    handler.mode = "slowloris"
    assert "did not answer in 0.5 s" in _tick_reason(m)
    assert time.monotonic() - started < 5.0  # two deadlines, not the 3 s and 30 s they asked
    handler.mode = "ok"
    assert _tick_reason(m).startswith("ok")  # and back
    m.stop()


def test_a_prometheus_that_is_down_at_start_is_a_monitor_that_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    m = gd.monitor(prometheus=url, display=False, interval=0.2)
    try:
        deadline = time.monotonic() + 20
        while m.ring.count < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        reasons = {reason for _, reason in m.na_index().values()}
        assert m.error is None
    finally:
        m.stop()
    assert any("cannot reach" in r and "is Prometheus running there?" in r for r in reasons)
    assert any("restart the monitor once it answers" in r for r in reasons)


def test_the_widget_shows_the_reason_and_stays_live(
    server: tuple[str, type[_Server]],
) -> None:
    from gpudiag.ui.monitor import MonitorChart

    url, handler = server
    backend = PrometheusBackend(url, lag_s=0.0, timeout_s=0.5)
    m = Monitor(GpuFeed(backend), interval=1.0, start=False)
    m.tick()
    chart = MonitorChart(m)
    handler.mode = "garbage"
    m.tick()
    assert any("API JSON" in reason for reason in chart.status["na"].values())
    assert chart.state == "created"  # not "error": the sampler carries on
    chart.close()


def test_huge_answers_are_refused_with_the_reason(server: tuple[str, type[_Server]]) -> None:
    url, _handler = server
    tiny = PrometheusClient(url, max_series=3)
    answer = tiny.query("up")
    assert answer.status is Status.UNKNOWN
    assert "more than max_series=3" in answer.reason
    capped = PrometheusClient(url, max_bytes=1000).query("up")
    assert "sent more than 1000 bytes" in capped.reason


def test_selectors_are_label_matchers_only() -> None:
    for bad in ('{job="x"}) or vector(1', 'job="x"} or {a="b"', "{__name__=~'.+'}"):
        with pytest.raises(ArgumentError, match="label matchers"):
            PrometheusBackend("http://127.0.0.1:9", bad)
    with pytest.raises(ArgumentError, match="not a Prometheus URL"):
        PrometheusBackend("ftp://host/")
    assert PrometheusBackend("h:9090", 'job="dcgm"').query.endswith(', job="dcgm"})')


# -- dcgm-exporter endpoints --------------------------------------------------------------------


def test_a_slowloris_exporter_is_cut_off_at_the_deadline(
    server: tuple[str, type[_Server]],
) -> None:
    url, handler = server
    handler.mode = "slowloris"
    started = time.monotonic()
    got = scrape(f"{url}/metrics", timeout_s=0.5)
    assert time.monotonic() - started < 3.0
    assert "did not answer in 0.5 s (it had sent" in got.reason
    started = time.monotonic()
    m = gd.monitor(endpoints=[f"{url}/metrics"], display=False, interval=0.5)
    try:
        assert time.monotonic() - started < 6.0  # the first scrape: one 2 s deadline
        (device,) = m.devices
        assert "did not answer in 2 s" in str(device.label) or m.na_index()
    finally:
        m.stop()


def test_a_page_of_a_million_series_is_refused_quickly() -> None:
    page = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}"}} 1\n' for i in range(1_000_000))
    started = time.monotonic()
    with pytest.raises(PrometheusParseError, match="more than 200000 series"):
        parse_exporter_text(page, "big")
    assert time.monotonic() - started < 10.0
    few_gpus_many_fields = "".join(
        f'DCGM_FI_DEV_F{i}{{gpu="{i % 5000}"}} 1\n' for i in range(20_000)
    )
    with pytest.raises(PrometheusParseError, match="more than 4096 GPUs"):
        parse_exporter_text(few_gpus_many_fields, "wide")


def test_an_exporter_page_of_a_million_series_is_na_not_memoryerror(
    server: tuple[str, type[_Server]],
) -> None:
    url, handler = server
    handler.mode = "ok"
    handler.body = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}"}} 1\n' for i in range(1_000_000)
    ).encode()
    backend = DcgmExporterBackend([f"{url}/metrics"], timeout_s=5.0)
    (gpu,) = backend.gpus
    assert "sent more than" in gpu.state.gpu_util_pct.reason
    backend.close()


def test_unicode_digits_in_an_exporter_page_never_raise() -> None:
    page = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="\u00b2",UUID="GPU-a"} 5\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="\u0661",UUID="GPU-b"} 7\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-c"} 9\n'
    )
    gpus = parse_exporter_text(page, "u")
    assert [g.info.index for g in gpus] == [3, 0, 0]  # ASCII first; others keep their label
    assert [g.gpu_label for g in gpus] == ["3", "\u00b2", "\u0661"]
    with pytest.raises(PrometheusParseError, match="not a number"):
        parse_prometheus_text("x \u0661\u0662\n")  # float() would read 12
    with pytest.raises(PrometheusParseError, match="bad timestamp"):
        parse_prometheus_text("x 1 \u00b2\n")


def test_http_get_refuses_what_is_not_http() -> None:
    assert "not an http(s) URL" in http_get("file:///etc/passwd").reason
    refused = http_get(f"http://127.0.0.1:{free_port()}/", timeout_s=1.0)
    assert refused.status is Status.NOT_FOUND


def test_the_magic_takes_prometheus_and_a_selector(
    server: tuple[str, type[_Server]], ipython_shell: Any
) -> None:
    url, _handler = server
    line = f"monitor --prometheus {url} --selector '{{job=\"dcgm\"}}' --interval 0.5"
    m = ipython_shell.run_line_magic("gpudiag", line)
    try:
        assert isinstance(m, Monitor)
        assert m.label.endswith('{job="dcgm"}')
        assert m.interval == 0.5
        assert [d.name for d in m.devices] == ["NVIDIA L4"]
    finally:
        m.stop()
