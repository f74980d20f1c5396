"""Fixtures for the trace tests: the recorded traces, and small hand-built Kineto traces."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace.load import kernel_names

RESNET_NW0 = "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"
RESNET_NW4 = "kineto-resnet50_num_workers_4-worker0.1623213129365.pt.trace.json.gz"
A100_CONTROL = "hta-trace_diff-control.json.gz"
V100_TEST = "hta-trace_diff-test.json.gz"
ALEXNET = "hta-critical_path-alexnet-benchmark_result_2869224_1695835535_trace.json.gz"
NCCL = "hta-nccl_parser_config-nccl_data.json.gz"
RANK0_OF_16 = "hta-negative_queue_length_values_check-rank0.json.gz"

# deviceProperties of the A100 in the recorded traces (one GPU is enough here).
A100 = {
    "id": 0,
    "name": "NVIDIA A100-PG509-200",
    "totalGlobalMem": 42505273344,
    "computeMajor": 8,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 167936,
    "numSms": 108,
    "sharedMemPerBlockOptin": 166912,
}


@pytest.fixture(scope="session")
def traces_dir(fixtures_dir: Path) -> Path:
    return fixtures_dir / "traces"


@pytest.fixture(scope="session")
def report_of(traces_dir: Path) -> Callable[[str], TraceReport]:
    """Analyse a recorded trace once per test session."""
    cache: dict[str, TraceReport] = {}

    def get(name: str) -> TraceReport:
        if name not in cache:
            cache[name] = analyze_trace(traces_dir / name)
        return cache[name]

    return get


class TraceBuilder:
    """Builds a Kineto trace in the layout torch.profiler writes (new-style categories)."""

    def __init__(self, pid: int = 100, tid: int = 100) -> None:
        self.pid, self.tid = pid, tid
        self.events: list[dict[str, Any]] = []
        self._corr = 1000

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": self.tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": len(self.events), **args},
            }
        )

    def step(self, number: int, ts: float, dur: float) -> None:
        self.op(f"ProfilerStep#{number}", ts, dur, cat="user_annotation")

    def launch(
        self,
        ts: float,
        start: float,
        dur: float,
        name: str = "void gemm_kernel(float*)",
        *,
        stream: int = 7,
        cat: str = "kernel",
        launch_dur: float = 3.0,
        grid: tuple[int, int, int] = (216, 1, 1),
        block: tuple[int, int, int] = (256, 1, 1),
        registers: int = 32,
        smem: int = 0,
        **gpu_args: Any,
    ) -> int:
        """A runtime launch call at ``ts`` and its GPU event running ``[start, start+dur)``."""
        self._corr += 1
        corr = self._corr
        runtime = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": runtime,
                "pid": self.pid,
                "tid": self.tid,
                "ts": ts,
                "dur": launch_dur,
                "args": {"correlation": corr},
            }
        )
        args: dict[str, Any] = {"device": 0, "stream": stream, "correlation": corr, **gpu_args}
        if cat == "kernel":
            args.update(
                {
                    "grid": list(grid),
                    "block": list(block),
                    "registers per thread": registers,
                    "shared memory": smem,
                }
            )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": args,
            }
        )
        return corr

    def document(self, **meta: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [A100]}
        doc.update(meta)
        doc["traceEvents"] = self.events
        return doc

    def write(self, path: Path, **meta: Any) -> Path:
        text = json.dumps(self.document(**meta), indent=1)
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path


@pytest.fixture
def builder() -> TraceBuilder:
    return TraceBuilder()


@pytest.fixture(scope="session")
def fixture_kernel_names(traces_dir: Path) -> set[str]:
    """Every distinct GPU kernel name in the recorded traces."""
    return kernel_names(sorted(traces_dir.rglob("*.json.gz")))
