"""What the report says about recorded V100/A100 runs and about small hand-built traces."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace.kernels import (
    is_tensor_core_eligible_op,
    short_name,
    uses_tensor_cores,
)
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind
from tests.analysis.trace.conftest import (
    A100_CONTROL,
    NCCL,
    RANK0_OF_16,
    RESNET_NW0,
    RESNET_NW4,
    V100_TEST,
)

Report = Callable[[str], TraceReport]


# -- the before/after DataLoader pair ------------------------------------------------------


def test_dataloader_share_drops_with_workers(report_of: Report) -> None:
    before, after = report_of(RESNET_NW0), report_of(RESNET_NW4)
    assert before.dataloader_share is not None
    assert after.dataloader_share is not None
    assert before.dataloader_share > 0.3  # num_workers=0: loading on the training thread
    assert after.dataloader_share < 0.05
    # ... and the GPU idles less once the host stops loading data.
    assert after.time_breakdown()["idle_us"] < before.time_breakdown()["idle_us"] / 2


def test_breakdown_parts_add_up_to_the_span(report_of: Report) -> None:
    for name in (RESNET_NW0, A100_CONTROL, NCCL):
        b = report_of(name).time_breakdown()
        parts = ("compute_us", "communication_us", "memory_us", "sync_us", "idle_us")
        assert sum(b[k] for k in parts) == pytest.approx(b["span_us"], rel=1e-9)
        idle = ("idle_host_wait_us", "idle_kernel_wait_us", "idle_other_us")
        assert sum(b[k] for k in idle) == pytest.approx(b["idle_us"], rel=1e-9)


def test_steps_cover_every_profiler_step(report_of: Report) -> None:
    steps = report_of(RESNET_NW0).steps()
    assert [s.number for s in steps] == [5, 6, 7, 8, 9, 10]
    assert [s.in_window for s in steps] == [True] * 5 + [False]
    for s in steps:
        assert s.gpu is not None
        assert s.gpu.span_us == pytest.approx(s.duration_us)
        assert s.gpu.compute_us > 0
    assert np.mean([s.duration_us for s in steps]) == pytest.approx(175e3, rel=0.05)


def test_include_last_step_widens_the_window(traces_dir: Path) -> None:
    default = analyze_trace(traces_dir / RESNET_NW4)
    full = analyze_trace(traces_dir / RESNET_NW4, include_last_step=True)
    assert full.time_breakdown()["compute_us"] > default.time_breakdown()["compute_us"]
    assert sum(k.count for k in full.kernels()) == 8868
    assert "6 steps" in full.rank().window


# -- tensor cores --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("volta_h884gemm_64x64_ldg8_nn", True),
        ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", True),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", True),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", True),
        ("ampere_tf32_s1688gemm_tf32_128x128_32x3_nn", True),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", True),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", True),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(Params)", True),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT", True),
        ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Params)", True),
        ("sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64", True),
        ("ampere_sgemm_128x64_nn", False),
        ("volta_sgemm_128x32_nt", False),
        ("volta_scudnn_128x64_relu_medium_nn_v1", False),
        ("cutlass_80_simt_sgemm_128x128_8x4_nn_align1", False),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8", False),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>", False),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", False),
    ],
)
def test_tensor_core_kernel_names(name: str, expected: bool) -> None:
    assert uses_tensor_cores(name) is expected


def test_tensor_core_eligible_ops() -> None:
    for op in (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::linear",
        "aten::cudnn_convolution",
        "aten::convolution_backward",
        "aten::_scaled_dot_product_flash_attention",
    ):
        assert is_tensor_core_eligible_op(op), op
    for op in ("aten::add_", "aten::copy_", "aten::batch_norm", "record_param_comms"):
        assert not is_tensor_core_eligible_op(op), op


def test_fp32_v100_convolutions_run_without_tensor_cores(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    tc = report.rank().tensor_cores
    assert tc is not None
    assert report.tensor_core_share == 0.0
    assert tc.linked_share == pytest.approx(1.0)
    names = {op.name for op in tc.eligible_ops}
    assert "aten::cudnn_convolution" in names
    assert tc.eligible_without_tensor_cores_us is not None
    # Most of the compute time is convolution work that tensor cores could have done.
    assert tc.eligible_without_tensor_cores_us > 0.4 * tc.compute_us


def test_a100_tensor_core_share_and_eligible_ops(report_of: Report) -> None:
    report = report_of(RANK0_OF_16)
    tc = report.rank().tensor_cores
    assert tc is not None
    assert report.tensor_core_share is not None
    assert 0.3 < report.tensor_core_share < 0.8
    tc_kernels = [k for k in report.kernels() if k.tensor_cores]
    assert all("tensorop" in k.name or "xmma" in k.name or "sm80" in k.name for k in tc_kernels)
    assert tc.tensor_core_us == pytest.approx(sum(k.total_us for k in tc_kernels))


# -- kernels, launch configuration, occupancy ---------------------------------------------


def test_kernel_table_launch_configuration(report_of: Report) -> None:
    k = next(
        k
        for k in report_of(RESNET_NW0).kernels()
        if k.name == "volta_scudnn_128x64_relu_interior_nn_v1"
    )
    assert k.block == (128, 1, 1)
    assert k.registers_per_thread == 128
    assert k.shared_memory_bytes == 16384
    # 128 registers x 128 threads = 16 K registers per block: 4 blocks of 4 warps on 64.
    assert k.theoretical_occupancy == pytest.approx(0.25)
    assert "registers" in k.occupancy_limited_by
    assert k.sm_efficiency == pytest.approx(1.0)
    assert k.launched_by == "aten::cudnn_convolution"


def test_achieved_occupancy_matches_kinetos_estimate(traces_dir: Path) -> None:
    """Kineto records its own estimate per kernel (whole percent). gpudiag's matches it,
    except above 48 KiB of shared memory, where Kineto reports 0."""
    from gpudiag.analysis.trace.kernels import launch_columns

    for name in (V100_TEST, A100_CONTROL):
        trace = load_trace(traces_dir / name)
        ev = trace.events
        rows = np.flatnonzero(ev.kind == Kind.KERNEL)
        cats = np.array(["compute"] * rows.size, dtype=object)
        cols = launch_columns(ev, rows, trace.devices, cats)
        x = ev.extra[rows]
        kineto = ev.launches.kineto_achieved_occupancy[x]
        small = ev.launches.shared_memory_bytes[x] <= 48 * 1024
        both = small & np.isfinite(kineto) & np.isfinite(cols.achieved)
        assert both.sum() > 0.8 * rows.size
        assert np.abs(cols.achieved[both] - kineto[both]).max() <= 0.0051


def test_kernel_statistics_against_a_hand_count(traces_dir: Path) -> None:
    ev = load_trace(traces_dir / RESNET_NW4).events
    report = analyze_trace(traces_dir / RESNET_NW4, include_last_step=True)
    target = report.kernels()[0]
    rows = np.flatnonzero((ev.kind == Kind.KERNEL) & (ev.name == ev.names.index(target.name)))
    dur = ev.dur[rows]
    assert target.count == rows.size
    assert target.total_us == pytest.approx(dur.sum())
    assert target.std_us == pytest.approx(dur.std(ddof=1))
    assert target.max_us == dur.max()
    assert target.min_us == dur.min()


def test_short_name_drops_arguments() -> None:
    assert short_name("void foo<int, 2>(float*, int)") == "foo<int, 2>"
    assert short_name("volta_sgemm_128x32_nt") == "volta_sgemm_128x32_nt"
    assert len(short_name("k" * 300)) == 80


# -- memcpy, syncs, overlap, launches -------------------------------------------------------


def test_memcpy_directions_and_pageable_copies(report_of: Report) -> None:
    transfers = report_of(RESNET_NW0).transfers()
    htod = next(t for t in transfers if t.direction == "HtoD")
    assert htod.source == "Pageable"
    assert htod.destination == "Device"
    assert htod.pageable
    assert htod.total_bytes > 0
    assert htod.achieved_gbps is not None
    assert htod.peak_gbps == pytest.approx(15.75)  # V100 DGXS: PCIe gen 3 x16
    assert 0 < (htod.fraction_of_peak or 0) < 1
    pinned = [t for t in report_of(RANK0_OF_16).transfers() if t.source == "Pinned"]
    assert pinned
    assert not pinned[0].pageable


def test_sync_points_carry_python_call_sites(report_of: Report) -> None:
    report = report_of(RESNET_NW0)
    syncs = report.syncs()
    assert syncs
    # The stream syncs after each copy, and the pageable input copies that block on the stream.
    assert {s.name for s in syncs} == {"cudaStreamSynchronize", "cudaMemcpyAsync"}
    assert {s.copy for s in syncs if s.name == "cudaMemcpyAsync"} == {
        "Memcpy HtoD (Pageable -> Device)"
    }
    assert all(s.call_site and s.call_site.startswith("resnet50_profiler_api.py(") for s in syncs)
    assert {s.inside_op for s in syncs} == {"aten::copy_"}
    sites = report.sync_sites()
    assert sum(s.count for s in sites) == len(syncs)


def test_item_calls_are_sync_points(report_of: Report) -> None:
    syncs = report_of(RANK0_OF_16).syncs()
    ops = [s for s in syncs if s.name == "aten::_local_scalar_dense"]
    assert ops
    assert all(s.inside_op == "aten::item" for s in ops)
    assert all(s.step is not None for s in ops)


def test_comm_compute_overlap_matches_category_sets(report_of: Report) -> None:
    rank = report_of(A100_CONTROL).rank()
    sets = rank.busy_by_category_set
    comm = sum(v for k, v in sets.items() if "communication" in k.split("+"))
    both = sum(v for k, v in sets.items() if {"compute", "communication"} <= set(k.split("+")))
    assert rank.comm_compute_overlap == pytest.approx(both / comm)
    assert 0.2 < (rank.comm_compute_overlap or 0) < 0.8


def test_launch_stats(report_of: Report) -> None:
    launches = report_of(RESNET_NW0).launch_stats()
    assert launches is not None
    assert launches.kernels == 7310
    assert launches.short_kernels == 4555
    assert launches.launch_delay_median_us is not None
    assert launches.launch_delay_median_us > 0
    assert launches.launch_bound is False  # the idle is one long data-loading stall per step


# -- hand-built traces: exact answers -------------------------------------------------------


def test_idle_split_on_a_hand_built_trace(builder: Any, tmp_path: Path) -> None:
    b = builder
    b.launch(ts=0, start=10, dur=100)  # busy 10-110
    b.launch(ts=20, start=115, dur=50)  # queued early: 5 us gap = kernel wait
    b.launch(ts=200, start=210, dur=40)  # launched after the GPU went idle: host wait (45)
    b.launch(ts=220, start=300, dur=10, cat="gpu_memcpy", name="Memcpy HtoD (Pinned -> Device)")
    # queued at 220 while busy until 250; starts at 300: a 50 us gap the host did not cause.
    report = analyze_trace(b.write(tmp_path / "t.json"))
    t = report.time_breakdown()
    assert t["span_us"] == 300
    assert t["compute_us"] == 190
    assert t["memory_us"] == 10
    assert t["idle_us"] == 100
    assert t["idle_kernel_wait_us"] == pytest.approx(5)
    assert t["idle_host_wait_us"] == pytest.approx(45)
    assert t["idle_other_us"] == pytest.approx(50)
    (stream,) = report.idle_breakdown()
    assert (stream.kernel_wait_us, stream.host_wait_us, stream.other_us) == (5, 45, 50)


def test_priority_counts_each_instant_once(builder: Any, tmp_path: Path) -> None:
    b = builder
    b.launch(ts=0, start=0, dur=100, name="ncclKernel_AllReduce_RING_LL_Sum_float(x)", stream=9)
    b.launch(ts=1, start=50, dur=100)  # compute overlaps the second half of the all-reduce
    b.launch(ts=2, start=120, dur=60, cat="gpu_memset", name="Memset (Device)", stream=11)
    report = analyze_trace(b.write(tmp_path / "t.json"))
    t = report.time_breakdown()
    assert (t["compute_us"], t["communication_us"], t["memory_us"]) == (100, 50, 30)
    assert t["idle_us"] == 0
    assert report.comm_compute_overlap() == pytest.approx(0.5)
    assert report.rank().busy_by_category_set == {
        "communication": 50,
        "compute+communication": 50,
        "compute": 20,
        "compute+memory": 30,
        "memory": 30,
    }


def test_launch_bound_when_short_host_gaps_dominate(builder: Any, tmp_path: Path) -> None:
    b = builder
    t = 0.0
    for _ in range(200):  # 4 us kernels, each launched 2 us after the previous one ended
        b.launch(ts=t + 6, start=t + 10, dur=4)
        t += 10
    launches = analyze_trace(b.write(tmp_path / "t.json")).launch_stats()
    assert launches is not None
    assert launches.launch_bound is True
    assert launches.short_kernels == 200


def test_eligible_op_without_tensor_cores_on_a_hand_built_trace(
    builder: Any, tmp_path: Path
) -> None:
    b = builder
    b.op("aten::mm", ts=0, dur=20)
    b.launch(ts=5, start=30, dur=100, name="ampere_sgemm_128x64_nn")
    b.op("aten::mm", ts=40, dur=20)
    b.launch(ts=45, start=140, dur=50, name="ampere_h16816gemm_128x128_ldg8_nn")
    b.op("aten::add", ts=80, dur=20)
    b.launch(ts=85, start=200, dur=10, name="elementwise_kernel")
    report = analyze_trace(b.write(tmp_path / "t.json"))
    tc = report.rank().tensor_cores
    assert tc is not None
    assert report.tensor_core_share == pytest.approx(50 / 160)
    (mm,) = tc.eligible_ops
    assert (mm.name, mm.count, mm.kernel_us, mm.tensor_core_us) == ("aten::mm", 2, 150, 50)
    assert tc.eligible_without_tensor_cores_us == 100


def test_stragglers_across_ranks(builder: Any, tmp_path: Path) -> None:
    from tests.analysis.trace.conftest import TraceBuilder

    paths = []
    for rank, work in enumerate((100.0, 102.0, 140.0, 99.0)):
        tb = TraceBuilder()
        tb.step(1, 0, 500)
        tb.step(2, 500, 500)
        for s in (0, 500):
            tb.launch(ts=s + 1, start=s + 10, dur=work)
            wait = 150.0 - work  # the others wait in the all-reduce for the slow rank
            tb.launch(ts=s + 2, start=s + 10 + work, dur=wait + 20, name="ncclKernel_AllReduce_x")
        paths.append(
            tb.write(tmp_path / f"rank{rank}.json", distributedInfo={"rank": rank, "world_size": 4})
        )
    report = analyze_trace(paths)
    assert [c.rank for c in report.comparison] == [0, 1, 2, 3]
    assert report.stragglers == (2,)
    assert report.missing_ranks == ()
    total = report.time_breakdown()
    assert total["compute_us"] == pytest.approx(sum(c.compute_us for c in report.comparison))
    pooled = report.kernels()
    assert sum(k.count for k in pooled) == 4 * 2  # 4 ranks, 2 kernels in the first step
    assert sum(k.share for k in pooled) == pytest.approx(1.0)


def test_ranks_without_rank_metadata_are_numbered(builder: Any, tmp_path: Path) -> None:
    builder.launch(ts=0, start=1, dur=5)
    a = builder.write(tmp_path / "a.json")
    b = builder.write(tmp_path / "b.json")
    report = analyze_trace([a, b])
    assert [r.rank for r in report.ranks] == [0, 1]
    assert any("ranks given by order" in n for n in report.notes)


# -- report objects -----------------------------------------------------------------------


def test_report_outputs(report_of: Report) -> None:
    report = report_of(A100_CONTROL)
    data = report.to_dict()
    text = json.dumps(data)
    assert "ProfilerStep" in data["ranks"][0]["window"]
    assert json.loads(text)["time_breakdown"]["compute_us"] == pytest.approx(
        report.time_breakdown()["compute_us"]
    )
    html = report._repr_html_()
    assert "Top kernels" in html
    assert "<script" not in html
    assert "A100" in repr(report)
    assert report.top_kernels(3) == report.kernels()[:3]
    assert len(report.top_cpu_ops(4)) == 4


def test_html_escapes_names(builder: Any, tmp_path: Path) -> None:
    builder.launch(ts=0, start=1, dur=5, name="<script>alert(1)</script>")
    html = analyze_trace(builder.write(tmp_path / "t.json"))._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
