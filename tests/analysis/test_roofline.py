"""Roofline: ceilings from the spec table and measurements, points from benchmarks and traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpudiag.analysis.roofline import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    RooflinePoint,
    as_point,
    op_point,
    points_from_benchmark,
    points_from_ops,
    roofline,
)
from gpudiag.bench.gemm import MatmulResult, MatmulRow
from gpudiag.bench.memory import BandwidthResult, BandwidthRow
from gpudiag.bench.timing import Measurement
from gpudiag.errors import GpuDiagError
from gpudiag.probe.readings import Status, na, ok

H100 = "NVIDIA H100 80GB HBM3"  # spec table: bf16 989.5 TFLOP/s dense, 3350 GB/s


def test_spec_ceilings_ridge_and_bounds() -> None:
    r = roofline(H100, points=[("gemv", 2e9, 1e9, 1e-3, "bf16"), ("gemm", 1e15, 1e12, 2.0, "bf16")])
    assert r.default_dtype == "bf16"
    assert r.ridge_intensity() == pytest.approx(989.5e12 / 3350e9)
    gemv, gemm = r.points
    assert r.bound(gemv) == MEMORY_BOUND
    assert r.bound(gemm) == COMPUTE_BOUND
    # gemv: 2 FLOP/B -> attainable 2 * 3350 GB/s = 6.7 TFLOP/s; achieved 2 TFLOP/s.
    assert r.attainable_tflops(2.0) == pytest.approx(6.7)
    assert r.efficiency(gemv) == pytest.approx(2.0 / 6.7)
    assert r.efficiency(gemm) == pytest.approx(500 / 989.5)
    assert r.ridge_intensity("fp32") == pytest.approx(67e12 / 3350e9)


def test_measured_ceilings_from_benchmark_results() -> None:
    m = Measurement((0.01, 0.01, 0.01))
    matmul = MatmulResult(
        "cpu (Fake)",
        (MatmulRow("bf16", 1024, 1024, 1024, m, 0.2, correct=True),),
        peaks={"bf16": ok(0.5, "estimate: 2 cores x ...")},
    )
    bandwidth = BandwidthResult(
        "cpu (Fake)", (BandwidthRow("copy", 1 << 20, 2 << 20, m, 20.0, correct=True),)
    )
    r = roofline(points=[matmul], measured=[matmul, bandwidth])
    origins = {(c.kind, c.origin, c.value) for c in r.ceilings}
    assert ("compute", "measured", 0.2) in origins
    assert ("compute", "estimate", 0.5) in origins
    assert ("memory", "measured", 20.0) in origins
    # The theoretical (here: estimated) roof wins for the ridge; the measured one is drawn too.
    assert r.compute_ceiling("bf16").origin == "estimate"  # type: ignore[union-attr]
    assert r.ridge_intensity() == pytest.approx(0.5e12 / 20e9)
    (point,) = r.points
    assert point.flops == 2 * 1024**3
    assert point.bytes == 3 * 1024 * 1024 * 2
    assert point.seconds == 0.01


def test_no_roofs_is_said_not_guessed() -> None:
    r = roofline(points=[("x", 1.0, 1.0, 1.0)])
    assert r.ridge_intensity() is None
    assert r.bound(r.points[0]) is None
    assert any("no roofs" in n for n in r.notes)
    unknown = roofline("Mystery Accelerator 9000")
    assert any("no spec-table entry for Mystery" in n for n in unknown.notes)
    cpu_only = roofline(SimpleNamespace(gpus=()))
    assert any("no GPU in the system report" in n for n in cpu_only.notes)


def test_points_accept_tuples_mappings_and_reject_junk() -> None:
    p = as_point({"name": "k", "flops": 10, "bytes": 5, "seconds": 2, "dtype": "fp32"})
    assert (p.intensity, p.achieved_tflops, p.achieved_gbps) == (2.0, 5e-12, 2.5e-9)
    assert as_point(("k", 10, 5, 2)) == RooflinePoint("k", 10.0, 5.0, 2.0)
    with pytest.raises(GpuDiagError, match="name, flops, bytes, seconds"):
        as_point(("k", "lots"))
    with pytest.raises(GpuDiagError, match="measured="):
        roofline(measured=[object()])


def _op(
    name: str, shapes: list[list[int]], types: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    args: dict[str, Any] = {"Input Dims": shapes, "Input type": types or ["float"] * len(shapes)}
    args.update(extra)
    return {"name": name, "dur": 100.0, "args": args}


def test_matmul_like_ops() -> None:
    mm = op_point(_op("aten::mm", [[32, 64], [64, 16]]))
    assert mm.flops == 2 * 32 * 16 * 64
    assert mm.bytes == (32 * 64 + 64 * 16 + 32 * 16) * 4
    assert mm.seconds == pytest.approx(1e-4)
    addmm = op_point(_op("aten::addmm", [[16], [32, 64], [64, 16], [], []]))
    assert addmm.flops == 2 * 32 * 16 * 64
    bmm = op_point(_op("aten::bmm", [[8, 32, 64], [8, 64, 16]], ["c10::BFloat16"] * 2))
    assert bmm.flops == 2 * 8 * 32 * 16 * 64
    assert bmm.dtype == "bf16"
    assert bmm.bytes == (8 * 32 * 64 + 8 * 64 * 16 + 8 * 32 * 16) * 2
    linear = op_point(_op("aten::linear", [[4, 10, 64], [128, 64], [128]]))
    assert linear.flops == 2 * 40 * 64 * 128
    matmul = op_point(_op("aten::matmul", [[2, 3, 32, 64], [2, 3, 64, 16]]))
    assert matmul.flops == 2 * 6 * 32 * 16 * 64


def test_convolution_needs_its_stride_and_padding() -> None:
    shapes = [[8, 3, 32, 32], [16, 3, 3, 3], [16]]
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    conv = op_point(_op("aten::convolution", shapes, **{"Concrete Inputs": concrete}))
    # output 8 x 16 x 16 x 16; each output needs 3 * 3 * 3 multiply-adds.
    assert conv.flops == 2 * (8 * 16 * 16 * 16) * 3 * 9
    points, skipped = points_from_ops([_op("aten::conv2d", shapes), _op("aten::relu", [[8]])])
    assert points == []
    assert skipped == [("aten::conv2d", "stride and padding not recorded in the trace")]


def test_attention_op() -> None:
    q = [2, 4, 128, 64]
    full = op_point(_op("aten::scaled_dot_product_attention", [q, q, q]))
    assert full.flops == 4 * 8 * 128 * 128 * 64
    concrete = ["", "", "", "", "0.0", "True"]
    causal = op_point(
        _op("aten::scaled_dot_product_attention", [q, q, q], **{"Concrete Inputs": concrete})
    )
    assert causal.flops == full.flops / 2


def test_nested_ops_count_once() -> None:
    outer = {
        "name": "aten::linear",
        "ts": 0.0,
        "dur": 10.0,
        "tid": 1,
        "args": {"Input Dims": [[4, 8], [16, 8], [16]], "Input type": ["float"] * 3},
    }
    inner = {
        "name": "aten::addmm",
        "ts": 1.0,
        "dur": 8.0,
        "tid": 1,
        "args": {"Input Dims": [[16], [4, 8], [8, 16]], "Input type": ["float"] * 3},
    }
    later = {**inner, "ts": 20.0}
    points, _ = points_from_ops([inner, outer, later])
    assert [p.name for p in points] == ["aten::linear", "aten::addmm"]


def test_points_from_a_real_kineto_trace(fixtures_dir: Path) -> None:
    path = (
        fixtures_dir
        / "traces"
        / "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"
    )
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ops = [e for e in events if e.get("cat") in {"cpu_op", "Operator"}]
    points, skipped = points_from_ops(ops)
    fc = [p for p in points if p.name == "aten::linear"]
    assert fc
    assert all(p.flops == 2 * 32 * 2048 * 1000 for p in fc)
    assert {name for name, _ in skipped} == {"aten::conv2d"}
    r = roofline("Tesla V100-DGXS-32GB", ops=ops)
    assert r.points
    assert r.skipped
    assert r.default_dtype == "fp32"


def test_points_from_benchmark_skip_failed_rows() -> None:
    ok_row = MatmulRow("fp32", 8, 8, 8, Measurement((1.0,)), 1e-9, correct=True)
    bad_row = MatmulRow("fp32", 8, 8, 8, None, None, reason="cannot run")
    assert len(points_from_benchmark(MatmulResult("cpu", (ok_row, bad_row)))) == 1


def test_json_and_html() -> None:
    r = roofline(H100, points=[("<b>k</b>", 1e11, 1e9, 1e-3, "bf16")])
    data = json.loads(json.dumps(r.to_dict()))
    assert data["points"][0]["bound"] == MEMORY_BOUND
    html = r._repr_html_()
    assert "<b>k" not in html
    assert "&lt;b&gt;k" in html
    assert "ridge at" in repr(r)
    na_peak = MatmulResult("cpu", (), peaks={"fp32": na(Status.NOT_SUPPORTED, "none")})
    assert roofline(measured=[na_peak]).ceilings == ()


@pytest.mark.parametrize(
    ("trace", "device", "bf16_tflops", "gbps"),
    [
        # ROCm's generic name for a GCD of 104 CUs and 64 GB: an MI210 or one MI250 GCD.
        (
            "hta-amd_trace-mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            "AMD Instinct MI210 or MI250 (one GCD)",
            181.0,
            1638.4,
        ),
        ("tracelens-mi300-resnet_act_checkpoint.json.gz", "AMD Instinct MI300X", 1307.4, 5300),
        ("tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz", "AMD Instinct MI300X", 1307.4, 5300),
    ],
)
def test_the_amd_traces_roofs_come_from_the_spec_table(
    fixtures_dir: Path, trace: str, device: str, bf16_tflops: float, gbps: float
) -> None:
    import gpudiag as gd

    report = gd.analyze_trace(fixtures_dir / "traces" / trace, progress=False)
    roof = report.roofline(dtype="bf16")
    compute, memory = roof.compute_ceiling(), roof.memory_ceiling()
    assert compute is not None
    assert memory is not None
    assert roof.device == device
    assert compute.value == pytest.approx(bf16_tflops)
    assert memory.value == pytest.approx(gbps)  # GB/s
