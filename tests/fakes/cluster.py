"""A GPU cluster on 127.0.0.1: real dcgm-exporter scrapes served as several nodes, and a real
Prometheus server (Debian's ``prometheus`` binary) scraping them.

``ExporterFarm`` serves ``/node-NN/metrics`` pages made from a real scrape in
``tests/fixtures/dcgm-exporter/`` (its lines, labels and HELP/TYPE text as recorded): each
node gets ``gpus`` copies of the recorded GPU (its own ``gpu``, ``UUID``, ``device`` and
``Hostname`` labels), plus ``DCGM_FI_PROF_SM_ACTIVE`` (the field an operator adds with
``-f``), and the activity values move with time (a slow sine per GPU) so that every scrape
differs. ``straggler=(node, gpu)`` plants one GPU whose SM activity and utilization stay low.

``PrometheusServer`` starts the binary on a free port with a temporary storage folder and a
short scrape interval, waits for it by polling (readiness, then every target scraped a few
times), and stops it on every exit path.
"""

from __future__ import annotations

import http.server
import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# The README's line, word for word (tests/test_readme.py keeps them the same).
PROMETHEUS_LINE = (
    "Under `CI=true` the Prometheus tests need Debian's `prometheus` package "
    "(`apt-get install -y prometheus`), which `.ci/run` installs; elsewhere they skip without it."
)
SCRAPE_INTERVAL_S = 1


def prometheus_or_skip() -> str:
    """The binary's path; skips (fails under CI=true) when it is missing."""
    if Path(PROMETHEUS).is_file() and os.access(PROMETHEUS, os.X_OK):
        return PROMETHEUS
    reason = f"{PROMETHEUS} not found. {PROMETHEUS_LINE}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Prometheus tests cannot run under CI: {reason}")
    pytest.skip(reason)
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the exporters ----------------------------------------------------------------------------

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")


class ExporterFarm:
    """``nodes`` x ``gpus`` dcgm-exporter pages on one local HTTP server."""

    def __init__(
        self,
        nodes: int,
        gpus: int,
        *,
        template: str = "kops-aws-l4.prom",
        straggler: tuple[int, int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nodes = nodes
        self.gpus = gpus
        self.straggler = straggler
        self.clock = clock
        self.lines = (FIXTURES / "dcgm-exporter" / template).read_text().splitlines()
        self.requests = 0
        self.down: set[int] = set()  # nodes whose exporter answers 503
        farm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                match = re.fullmatch(r"/node-(\d+)/metrics", self.path)
                if match is None or int(match.group(1)) >= farm.nodes:
                    self.send_error(404)
                    return
                if int(match.group(1)) in farm.down:
                    self.send_error(503)
                    return
                body = farm.page(int(match.group(1))).encode()
                farm.requests += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # a scrape that timed out and hung up: nothing to answer
                    return

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @staticmethod
    def hostname(node: int) -> str:
        return f"node-{node:02d}"

    def path(self, node: int) -> str:
        return f"/node-{node:02d}/metrics"

    def url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.port}{self.path(node)}"

    def _value(self, name: str, recorded: str, node: int, gpu: int, t: float) -> str:
        wave = math.sin(t / 5.0 + 0.7 * node + 0.3 * gpu)
        slow = (node, gpu) == self.straggler
        if name == "DCGM_FI_DEV_GPU_UTIL":
            return str(round(40 + 5 * wave) if slow else round(90 + 5 * wave))
        if name in {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"}:
            return f"{(0.2 if slow else 0.8) + 0.05 * wave:.6f}"
        if name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
            return f"{(0.05 if slow else 0.35) + 0.05 * wave:.6f}"
        if name == "DCGM_FI_DEV_FB_USED":
            return str(9000 + 500 * node + 100 * gpu)
        if name == "DCGM_FI_DEV_POWER_USAGE":
            return f"{60 + 10 * wave:.3f}"
        return recorded

    def page(self, node: int, t: float | None = None) -> str:
        now = self.clock() if t is None else t
        out: list[str] = []
        for gpu in range(self.gpus):
            for line in self.lines:
                if line.startswith("#"):
                    if gpu == 0:
                        out.append(line)
                    continue
                m = _LINE.match(line)
                if m is None:
                    continue
                labels = m.group("labels")
                labels = re.sub(r'gpu="\d+"', f'gpu="{gpu}"', labels)
                labels = re.sub(r'device="nvidia\d+"', f'device="nvidia{gpu}"', labels)
                suffix = f"{node:02x}{gpu:02x}"
                labels = re.sub(
                    r'UUID="GPU-([0-9a-f-]+?)[0-9a-f]{4}"',
                    lambda u, suffix=suffix: f'UUID="GPU-{u.group(1)}{suffix}"',
                    labels,
                )
                labels = re.sub(r'Hostname="[^"]*"', f'Hostname="{self.hostname(node)}"', labels)
                name = m.group("name")
                out.append(
                    f"{name}{{{labels}}} {self._value(name, m.group('value'), node, gpu, now)}"
                )
                if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                    sm = "DCGM_FI_PROF_SM_ACTIVE"
                    if gpu == 0:
                        out.append(
                            f"# HELP {sm} The ratio of cycles an SM has at least 1 warp "
                            "assigned (added with -f)."
                        )
                        out.append(f"# TYPE {sm} gauge")
                    out.append(f"{sm}{{{labels}}} {self._value(sm, '0', node, gpu, now)}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


# -- the Prometheus server ----------------------------------------------------------------------


def _get_json(url: str, params: dict[str, str] | None = None, timeout_s: float = 5.0) -> Any:
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


class PrometheusServer:
    """Debian's Prometheus on 127.0.0.1, scraping ``farm``'s nodes every second."""

    def __init__(self, farm: ExporterFarm, workdir: Path, *, job: str = "dcgm") -> None:
        self.binary = prometheus_or_skip()
        self.farm = farm
        self.job = job
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> str:
        targets = "\n".join(
            f"      - targets: ['127.0.0.1:{self.farm.port}']\n"
            # One address, one path per node: the instance label tells the targets apart.
            f"        labels: {{__metrics_path__: '{self.farm.path(n)}', "
            f"instance: '{self.farm.hostname(n)}:9400'}}"
            for n in range(self.farm.nodes)
        )
        return (
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
            f"  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n"
            f"  - job_name: {self.job}\n"
            "    static_configs:\n"
            f"{targets}\n"
        )

    def start(self, *, scrapes: int = 3, timeout_s: float = 90.0) -> PrometheusServer:
        config = self.workdir / "prometheus.yml"
        config.write_text(self._config())
        deadline = time.monotonic() + timeout_s
        for _attempt in range(3):  # a free port can be taken before the server binds it
            self.port = free_port()
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if self._wait_ready(deadline):
                break
            self.stop()
        else:
            raise RuntimeError(f"Prometheus did not start: {self._log_tail()}")
        self._wait_scraped(scrapes, deadline)
        return self

    def _wait_ready(self, deadline: float) -> bool:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def _wait_scraped(self, scrapes: int, deadline: float) -> None:
        """Until every node was scraped ``scrapes`` times (polling, never a fixed sleep)."""
        query = f'count_over_time(up{{job="{self.job}"}}[5m])'
        while time.monotonic() < deadline:
            try:
                result = _get_json(f"{self.url}/api/v1/query", {"query": query})["data"]["result"]
            except (OSError, KeyError, ValueError):
                result = []
            counts = [float(r["value"][1]) for r in result]
            if len(counts) == self.farm.nodes and min(counts) >= scrapes:
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"Prometheus did not scrape every node {scrapes} times: {self._log_tail()}"
        )

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """What Prometheus answers, read without gpudiag (urllib and json)."""
        data = _get_json(f"{self.url}/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        return list(data["data"]["result"])

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        params = {
            "query": promql,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step:g}",
        }
        return list(_get_json(f"{self.url}/api/v1/query_range", params)["data"]["result"])

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
