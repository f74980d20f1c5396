"""Operator input shapes from real traces: the costed-op side table, GEMM sizes, roofline."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.costed_ops import COSTED_OPS
from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace import load as trace_load
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind
from gpudiag.analysis.trace.shapes import gemm_dims
from tests.analysis.trace.conftest import A100_CONTROL, ALEXNET, RESNET_NW0, TraceBuilder

Report = Callable[[str], TraceReport]


# -- real traces ----------------------------------------------------------------------------


def test_resnet50_fc_layer_is_linear_2048_to_1000_on_the_trace_batch(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    ops = report.shaped_ops()
    # The stem convolution's input is the image batch: [batch, 3, 224, 224].
    stem = next(op for op in ops if op.name == "aten::conv2d")
    batch, channels = stem.input_shapes[0][:2]
    assert channels == 3
    fc = [g for g in report.gemm_shapes() if g.name == "aten::linear"]
    assert len(fc) == 1
    assert (fc[0].dims.m, fc[0].dims.n, fc[0].dims.k) == (batch, 1000, 2048)
    assert fc[0].dims.m_from_batch
    assert fc[0].dtype == "fp32"
    assert fc[0].count == len(report.steps()) - 1  # one per step in the window


def test_resnet50_has_53_convolutions_and_one_fc_per_step(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    per_step = Counter((op.step, op.name) for op in report.shaped_ops())
    window = [s.number for s in report.steps() if s.in_window]
    assert {step for step, _ in per_step} == set(window)
    for step in window:
        assert per_step[(step, "aten::conv2d")] == 53  # 1 stem + 16 blocks x 3 + 4 downsample
        assert per_step[(step, "aten::linear")] == 1


def test_outermost_op_only_linear_not_its_addmm(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    names = Counter(op.name for op in report.shaped_ops())
    cpu = {o.name: o.count for o in report.top_cpu_ops(10_000)}
    # The trace records aten::addmm inside every aten::linear, and the convolution chain
    # conv2d > convolution > _convolution > cudnn_convolution: each call is counted once.
    assert cpu["aten::addmm"] == cpu["aten::linear"] == names["aten::linear"]
    assert cpu["aten::cudnn_convolution"] == names["aten::conv2d"]
    assert not {"aten::addmm", "aten::convolution", "aten::cudnn_convolution"} & set(names)


@pytest.mark.parametrize("name", [RESNET_NW0, A100_CONTROL])
def test_gpu_time_of_shaped_ops_is_within_the_kernel_time(report_of: Report, name: str) -> None:
    report = report_of(name)
    ops = report.shaped_ops()
    tc = report.ranks[0].tensor_cores
    assert tc is not None
    gpu = [op.gpu_us for op in ops]
    assert all(g is not None and g >= 0 for g in gpu)
    total = sum(g for g in gpu if g is not None)
    assert 0 < total <= tc.compute_us
    assert sum(op.tensor_core_us or 0.0 for op in ops) <= tc.tensor_core_us + 1e-6
    assert all((op.tensor_core_us or 0.0) <= (op.gpu_us or 0.0) + 1e-9 for op in ops)
    # Every matmul call launched at least one kernel.
    assert all((op.gpu_us or 0.0) > 0 for op in ops if op.gemm is not None)


def test_gemm_shapes_are_ranked_by_gpu_time(report_of: Report) -> None:
    shapes = report_of(A100_CONTROL).gemm_shapes()
    times = [s.gpu_us or 0.0 for s in shapes]
    assert times == sorted(times, reverse=True)
    keys = [(s.name, s.input_shapes, s.dtype) for s in shapes]
    assert len(keys) == len(set(keys))


def test_side_table_holds_only_costed_operators(traces_dir: Path) -> None:
    events = load_trace(traces_dir / RESNET_NW0).events
    cpu_ops = int((events.kind == Kind.CPU_OP).sum())
    named = {events.names[events.name[row]] for row in events.inputs}
    assert named <= COSTED_OPS
    assert 0 < len(events.inputs) < cpu_ops // 10
    # The same layer records the same inputs every step: records are shared, not copied.
    assert len({id(v) for v in events.inputs.values()}) < len(events.inputs) // 4


def test_a_trace_without_record_shapes_has_ops_but_no_gemm_shapes(report_of: Report) -> None:
    report = report_of(ALEXNET)
    ops = report.shaped_ops()
    assert {op.name for op in ops} == {"aten::conv2d", "aten::linear"}
    assert all(op.input_shapes == () for op in ops)
    assert report.gemm_shapes() == ()
    roof = report.roofline()
    assert roof.points == ()
    assert {reason for _, reason in roof.skipped} == {
        "no input shapes recorded (profile with record_shapes=True)"
    }


def test_roofline_times_ops_by_their_kernels(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    roof = report.roofline()
    assert "V100" in roof.device
    assert any(c.kind == "compute" and c.origin == "specs" for c in roof.ceilings)
    matmuls = [op for op in report.shaped_ops() if op.gemm is not None]
    assert len(roof.points) == len(matmuls)
    # Seconds are the kernels' time, not the (longer) host launch time.
    assert sum(p.seconds for p in roof.points) == pytest.approx(
        sum(op.gpu_us or 0.0 for op in matmuls) * 1e-6
    )
    assert sum(op.gpu_us or 0.0 for op in matmuls) < sum(op.cpu_us for op in matmuls)
    fc = next(p for p in roof.points if p.name == "aten::linear")
    stem_batch = next(op for op in report.shaped_ops() if op.name == "aten::conv2d")
    assert fc.flops == 2 * stem_batch.input_shapes[0][0] * 2048 * 1000
    # Convolutions are skipped with a reason: this trace has no Concrete Inputs (stride...).
    assert {name for name, _ in roof.skipped} == {"aten::conv2d"}


def test_report_dict_lists_gemm_shapes(report_of: Report) -> None:
    data = json.loads(json.dumps(report_of(RESNET_NW0).to_dict()))
    linear = [g for g in data["gemm_shapes"] if g["name"] == "aten::linear"]
    assert linear[0]["dims"]["k"] == 2048
    assert linear[0]["gpu_us"] > 0


# -- hand-built traces ---------------------------------------------------------------------

_LINEAR: dict[str, Any] = {
    "Input Dims": [[64, 100], [30, 100], [30]],
    "Input type": ["float"] * 3,
}
_ADDMM: dict[str, Any] = {
    "Input Dims": [[30], [64, 100], [100, 30], [], []],
    "Input type": ["float", "float", "float", "Scalar", "Scalar"],
}


def _linear_trace(b: TraceBuilder, *, gpu: bool = True, linked: bool = True) -> None:
    """Two steps, each an aten::linear calling aten::addmm, which launches one kernel."""
    for step in (1, 2):
        t0 = step * 1000.0
        b.step(step, t0, 500.0)
        b.op("aten::linear", t0 + 10, 50.0, **_LINEAR)
        b.op("aten::addmm", t0 + 12, 40.0, **_ADDMM)
        if gpu:
            b.launch(t0 + 20, t0 + 30, 7.0, "ampere_sgemm_32x32_sliced1x4_tn")
    if not linked:
        b.events = [e for e in b.events if e["cat"] != "cuda_runtime"]


def test_kernels_tie_to_the_outermost_op(builder: TraceBuilder, tmp_path: Path) -> None:
    _linear_trace(builder)
    report = analyze_trace(builder.write(tmp_path / "t.json"), include_last_step=True)
    ops = report.shaped_ops()
    assert [op.name for op in ops] == ["aten::linear", "aten::linear"]
    assert [op.step for op in ops] == [1, 2]
    assert [op.gpu_us for op in ops] == [7.0, 7.0]
    assert ops[0].cpu_us == 50.0
    assert ops[0].gemm is not None
    assert (ops[0].gemm.m, ops[0].gemm.n, ops[0].gemm.k) == (64, 30, 100)


def test_cpu_only_trace_times_ops_by_host_time(builder: TraceBuilder, tmp_path: Path) -> None:
    _linear_trace(builder, gpu=False)
    report = analyze_trace(builder.write(tmp_path / "t.json"), include_last_step=True)
    assert all(op.gpu_us is None for op in report.shaped_ops())
    (shape,) = report.gemm_shapes()
    assert (shape.count, shape.gpu_us, shape.cpu_us) == (2, None, 100.0)
    roof = report.roofline()
    assert [p.seconds for p in roof.points] == pytest.approx([50e-6, 50e-6])


def test_untied_kernels_are_left_out_of_the_roofline(builder: TraceBuilder, tmp_path: Path) -> None:
    _linear_trace(builder, linked=False)
    report = analyze_trace(builder.write(tmp_path / "t.json"), include_last_step=True)
    assert report.has_gpu_events
    assert all(op.gpu_us is None for op in report.shaped_ops())
    roof = report.roofline()
    assert roof.points == ()
    assert any("2 operator calls left out" in n for n in roof.notes)


def test_gemm_shapes_pool_ranks(builder: TraceBuilder, tmp_path: Path) -> None:
    _linear_trace(builder)
    paths = [
        builder.write(tmp_path / f"r{r}.json", distributedInfo={"rank": r, "world_size": 2})
        for r in (0, 1)
    ]
    report = analyze_trace(paths, include_last_step=True)
    (pooled,) = report.gemm_shapes()
    (one,) = report.gemm_shapes(rank=1)
    assert (pooled.count, pooled.gpu_us) == (2 * one.count, 2 * (one.gpu_us or 0.0))
    assert len(report.shaped_ops()) == 2 * len(report.shaped_ops(rank=0))


_MALFORMED: list[dict[str, Any]] = [
    {"Input Dims": "[[64, 100]]", "Input type": "float"},  # strings, not lists
    {"Input Dims": [[[2, 3], [2, 3]], [64, 100], [100, 30]], "Input type": [7, "float", None]},
    {"Input Dims": [[64, True], [-1, 30]], "Concrete Inputs": [{"x": 1}, "", 3]},
    {"Input Dims": None, "Input type": None},
]


def _malformed_trace(b: TraceBuilder) -> None:
    b.step(1, 0.0, 5000.0)
    for i, args in enumerate(_MALFORMED):
        b.op("aten::addmm", 100.0 + 100 * i, 50.0, **args)
        b.launch(110.0 + 100 * i, 200.0 + 100 * i, 5.0)


def _expected_inputs() -> list[tuple[Any, Any, Any]]:
    return [
        ((), (), ()),
        (((), (64, 100), (100, 30)), ("", "float", ""), ()),
        (((), ()), (), ("", "", "")),
        ((), (), ()),
    ]


def test_malformed_inputs_are_dropped_on_the_fast_path(
    builder: TraceBuilder, tmp_path: Path
) -> None:
    _malformed_trace(builder)
    ops = analyze_trace(builder.write(tmp_path / "t.json")).shaped_ops()
    got = [(op.input_shapes, op.input_types, op.concrete_inputs) for op in ops]
    assert got == _expected_inputs()
    # Only the second call keeps both matrix operands (its TensorList bias is dropped).
    assert [op.gemm is not None for op in ops] == [False, True, False, False]


def test_malformed_inputs_are_dropped_on_the_slow_path(
    builder: TraceBuilder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _malformed_trace(builder)
    builder.events[0]["args"]["stream"] = "7"  # a string stream id: the block decodes loosely
    loose = Counter[str]()
    original = trace_load._loose_event

    def counting(raw: Any) -> Any:
        loose[raw.get("name")] += 1
        return original(raw)

    monkeypatch.setattr(trace_load, "_loose_event", counting)
    ops = analyze_trace(builder.write(tmp_path / "t.json")).shaped_ops()
    assert loose["aten::addmm"] == len(_MALFORMED)
    got = [(op.input_shapes, op.input_types, op.concrete_inputs) for op in ops]
    assert got == _expected_inputs()


def test_slow_path_keeps_well_formed_shapes(builder: TraceBuilder, tmp_path: Path) -> None:
    _linear_trace(builder)
    builder.events[0]["args"]["stream"] = "x"  # forces the loose decoder for the block
    ops = analyze_trace(builder.write(tmp_path / "t.json"), include_last_step=True).shaped_ops()
    assert [op.input_shapes for op in ops] == [((64, 100), (30, 100), (30,))] * 2
    assert [op.dtype for op in ops] == ["fp32", "fp32"]


# -- GEMM sizes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shapes", "expected"),
    [
        ("aten::linear", [(8, 512, 768), (50257, 768), ()], (4096, 50257, 768, 1, True)),
        ("aten::addmm", [(30,), (64, 100), (100, 30), (), ()], (64, 30, 100, 1, True)),
        ("aten::mm", [(100, 64), (64, 30)], (100, 30, 64, 1, False)),
        ("aten::bmm", [(12, 128, 64), (12, 64, 128)], (128, 128, 64, 12, False)),
        ("aten::baddbmm", [(12, 1, 128), (12, 128, 64), (12, 64, 128)], (128, 128, 64, 12, False)),
        ("aten::matmul", [(8, 12, 128, 64), (8, 12, 64, 128)], (128, 128, 64, 96, False)),
        ("aten::matmul", [(8, 128, 64), (64, 30)], (1024, 30, 64, 1, True)),
    ],
)
def test_gemm_dims(name: str, shapes: list[tuple[int, ...]], expected: tuple[Any, ...]) -> None:
    dims = gemm_dims(name, shapes)
    assert dims is not None
    assert (dims.m, dims.n, dims.k, dims.batch, dims.m_from_batch) == expected


@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("aten::matmul", [(64,), (64, 30)]),  # a vector operand
        ("aten::mm", [(64, 100)]),  # a missing operand
        ("aten::mm", [(0, 100), (100, 30)]),  # empty
        ("aten::conv2d", [(8, 3, 224, 224), (64, 3, 7, 7)]),  # not a matmul
        ("aten::linear", [(), (30, 100)]),  # shapes not recorded
    ],
)
def test_gemm_dims_none(name: str, shapes: list[tuple[int, ...]]) -> None:
    assert gemm_dims(name, shapes) is None


def test_autocast_dtype_comes_from_the_op_that_did_the_work(tmp_path: Path) -> None:
    """Under autocast ``aten::linear`` records its fp32 inputs before the cast; the
    ``aten::addmm`` inside it records the bf16 the matmul ran in (a real CPU profile)."""
    import torch

    from gpudiag.profiling import profile

    layer = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x).sum().backward()

    report = profile(step, steps=1, warmup=1, trace_dir=str(tmp_path))
    forward = next(o for o in report.shaped_ops() if o.name == "aten::linear")
    assert "float" in [t.lower() for t in forward.input_types]  # before the autocast cast
    assert forward.dtype == "bf16"
    assert {g.dtype for g in report.gemm_shapes() if g.name == "aten::linear"} == {"bf16"}


def test_fp32_work_on_tensor_cores_sits_under_the_tf32_roof(report_of: Report) -> None:
    """The A100 control trace runs its fp32 matmuls as TF32: against the fp32 roof they would
    sit above it (about 150 %); against the TF32 roof none does."""
    result = report_of(A100_CONTROL).roofline()
    assert {"tf32", "fp32"} <= {p.dtype for p in result.points}
    efficiencies = [result.efficiency(p) for p in result.points]
    assert all(e is not None and e <= 1.0 for e in efficiencies)
