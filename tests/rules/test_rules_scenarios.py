"""Planted problems in synthetic traces written in the Kineto format: the top finding is the
planted one, and a healthy control gets no high-severity finding.

The traces follow what torch.profiler writes (``traceEvents`` with ``cpu_op``,
``cuda_runtime``, ``kernel``, ``gpu_memcpy`` events linked by ``External id`` and
``correlation``, ``ProfilerStep#N`` annotations and ``deviceProperties``); the numbers are
made up to carry exactly one problem each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.trace import analyze_trace
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity

A100 = {
    "id": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "totalGlobalMem": 85_899_345_920,
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

TC_GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1"
FP32_GEMM = "ampere_sgemm_128x64_nn"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
# CUTLASS names the operand alignment it was built for: align1 is the narrow-load fallback
# cuBLAS picks when a leading dimension is not a multiple of 8 bf16 elements.
UNALIGNED_GEMM = (
    "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_64x5_tn_align1>"
    "(cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_64x5_tn_align1::Params)"
)
BF16 = "c10::BFloat16"


@dataclass
class Kineto:
    """Builds one rank's trace: host thread 1, compute stream 7, communication stream 20."""

    events: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 1
    host_ts: float = 1000.0
    stream_ts: dict[int, float] = field(default_factory=dict)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def step(self, number: int, body: Any) -> None:
        start = self.host_ts
        body()
        self.host_ts += 5.0
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{number}",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": self.host_ts - start,
            }
        )

    def launch(
        self,
        op: str,
        kernel: str,
        kernel_us: float,
        *,
        host_us: float = 8.0,
        stream: int = 7,
        block: tuple[int, int, int] = (256, 1, 1),
        registers: int = 32,
        shared_memory: int = 0,
        grid: tuple[int, int, int] = (1024, 1, 1),
        input_dims: list[list[int]] | None = None,
        input_types: list[str] | None = None,
    ) -> None:
        """``input_dims`` / ``input_types``: the operator's "Input Dims" and "Input type", as
        ``record_shapes=True`` records them."""
        ext, corr = self._id(), self._id()
        ts = self.host_ts
        op_args: dict[str, Any] = {"External id": ext}
        if input_dims is not None:
            op_args["Input Dims"] = input_dims
        if input_types is not None:
            op_args["Input type"] = input_types
        self.events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": op,
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": host_us,
                "args": op_args,
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": ts + 1.0,
                "dur": host_us - 2.0,
                "args": {"correlation": corr, "External id": ext},
            }
        )
        start = max(ts + 3.0, self.stream_ts.get(stream, 0.0))
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": stream,
                "ts": start,
                "dur": kernel_us,
                "args": {
                    "correlation": corr,
                    "External id": ext,
                    "stream": stream,
                    "device": 0,
                    "grid": list(grid),
                    "block": list(block),
                    "registers per thread": registers,
                    "shared memory": shared_memory,
                },
            }
        )
        self.stream_ts[stream] = start + kernel_us
        self.host_ts = ts + host_us

    def memcpy(self, kind: str, nbytes: int, copy_us: float) -> None:
        ext, corr = self._id(), self._id()
        ts = self.host_ts
        self.events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::copy_",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": copy_us + 10.0,
                "args": {"External id": ext},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaMemcpyAsync",
                "pid": 1,
                "tid": 1,
                "ts": ts + 1.0,
                "dur": copy_us + 8.0,
                "args": {"correlation": corr, "External id": ext},
            }
        )
        start = max(ts + 3.0, self.stream_ts.get(7, 0.0))
        self.events.append(
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": f"Memcpy {kind}",
                "pid": 0,
                "tid": 7,
                "ts": start,
                "dur": copy_us,
                "args": {
                    "correlation": corr,
                    "External id": ext,
                    "stream": 7,
                    "device": 0,
                    "bytes": nbytes,
                },
            }
        )
        self.stream_ts[7] = start + copy_us
        self.host_ts = ts + copy_us + 10.0

    def wait_gpu(self) -> None:
        """The step ends when the GPU is done (the host is ahead otherwise)."""
        self.host_ts = max([self.host_ts, *self.stream_ts.values()])

    def write(self, path: Path) -> Path:
        data = {"schemaVersion": 1, "deviceProperties": [A100], "traceEvents": self.events}
        path.write_text(json.dumps(data))
        return path


def _healthy_step(k: Kineto) -> None:
    for _ in range(20):
        k.launch(
            "aten::mm",
            TC_GEMM,
            400.0,
            input_dims=[[4096, 768], [768, 3072]],
            input_types=[BF16, BF16],
        )
    k.wait_gpu()


def _no_tensor_cores(k: Kineto) -> None:
    for _ in range(20):
        k.launch("aten::mm", FP32_GEMM, 400.0)
    k.wait_gpu()


def _launch_bound(k: Kineto) -> None:
    for _ in range(300):
        k.launch("aten::add", ELEMENTWISE, 4.0, host_us=25.0)
    k.wait_gpu()


def _pageable_copies(k: Kineto) -> None:
    k.memcpy("HtoD (Pageable -> Device)", 64 * 2**20, 6000.0)
    for _ in range(20):
        k.launch("aten::mm", TC_GEMM, 400.0)
    k.wait_gpu()


def _exposed_nccl(k: Kineto) -> None:
    for _ in range(20):
        k.launch("aten::mm", TC_GEMM, 400.0)
    k.wait_gpu()
    k.launch(
        "c10d::allreduce_", NCCL, 5000.0, stream=20, block=(544, 1, 1), registers=96, grid=(8, 1, 1)
    )
    k.wait_gpu()


def _low_occupancy(k: Kineto) -> None:
    for _ in range(20):
        k.launch("aten::mm", TC_GEMM, 100.0)
        # 40 KiB of shared memory per 64-thread block: 4 blocks per SM, 8 of 64 warps.
        k.launch(
            "my_ext::fused_op",
            "my_fused_kernel(float*, float const*, int)",
            400.0,
            block=(64, 1, 1),
            shared_memory=40 * 1024,
        )
    k.wait_gpu()


def _unaligned_gemm(k: Kineto) -> None:
    # A bf16 GPT-2-sized model: 12 aligned projections (4096 rows = batch 8 x sequence 512,
    # 768 features), then the LM head onto the raw GPT-2 vocabulary of 50257 tokens.
    for _ in range(12):
        k.launch(
            "aten::linear",
            TC_GEMM,
            100.0,
            input_dims=[[8, 512, 768], [768, 768], [768]],
            input_types=[BF16, BF16, BF16],
        )
    k.launch(
        "aten::linear",
        UNALIGNED_GEMM,
        3000.0,
        input_dims=[[8, 512, 768], [50257, 768], []],
        input_types=[BF16, BF16, ""],
    )
    k.wait_gpu()


SCENARIOS = {
    "no_tensor_cores": (_no_tensor_cores, "precision.fp32_on_tensor_cores"),
    "launch_bound": (_launch_bound, "launch.launch_bound"),
    "pageable_memcpy": (_pageable_copies, "memcpy.pageable"),
    "exposed_nccl": (_exposed_nccl, "comm.exposed"),
    "low_occupancy": (_low_occupancy, "occupancy.low"),
    "unaligned_gemm": (_unaligned_gemm, "shapes.gemm_alignment"),
}


def _diagnose(tmp_path: Path, body: Any) -> Any:
    k = Kineto()
    for n in range(1, 6):
        k.step(n, lambda: body(k))
    trace = analyze_trace(k.write(tmp_path / "rank0.pt.trace.json"))
    return run_rules(EvidenceBundle(trace=trace, env={}))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_planted_problem_is_the_top_finding(tmp_path: Path, scenario: str) -> None:
    body, expected = SCENARIOS[scenario]
    diagnosis = _diagnose(tmp_path, body)
    assert diagnosis.findings, f"{scenario}: no findings"
    assert diagnosis.findings[0].id == expected, repr(diagnosis)


def test_healthy_control_has_no_high_severity_finding(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, _healthy_step)
    assert all(f.severity is not Severity.HIGH for f in diagnosis.findings), repr(diagnosis)
    assert "precision.fp32_on_tensor_cores" not in diagnosis.ids()
    # Its GEMMs carry aligned shapes: the shape rule ran on them and found nothing.
    assert "shapes.gemm_alignment" in diagnosis.evaluated
    assert not [n for n in diagnosis.not_evaluated if n.rule == "shapes.gemm_alignment"]
    assert "shapes.gemm_alignment" not in diagnosis.ids()
