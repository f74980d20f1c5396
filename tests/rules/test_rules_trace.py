"""Trace rules on real Kineto traces (V100 / A100 runs) and on edits of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace.breakdown import TimeBreakdown
from gpudiag.analysis.trace.launches import LaunchStats
from gpudiag.analysis.trace.ledger import (
    DATALOADER_IDLE,
    LAUNCH_IDLE,
    MEMORY_BOUND_WORK,
    OTHER_KERNELS,
    SYNC_IDLE,
    LedgerRow,
)
from gpudiag.analysis.trace.syncs import SyncEvent
from gpudiag.fixes import Fix
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity

RESNET_W0 = "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"
RESNET_W4 = "kineto-resnet50_num_workers_4-worker0.1623213129365.pt.trace.json.gz"
ALEXNET_A100 = "hta-critical_path-alexnet-benchmark_result_2869224_1695835535_trace.json.gz"
CONTROL_A100 = "hta-trace_diff-control.json.gz"
TEST_V100 = "hta-trace_diff-test.json.gz"
MULTINODE_A100 = "hta-negative_queue_length_values_check-rank0.json.gz"

_CACHE: dict[str, TraceReport] = {}


def _trace(fixtures_dir: Path, name: str) -> TraceReport:
    if name not in _CACHE:
        _CACHE[name] = analyze_trace(fixtures_dir / "traces" / name)
    return _CACHE[name]


def _findings(trace: TraceReport) -> dict[str, Severity]:
    diagnosis = run_rules(EvidenceBundle(trace=trace, env={}))
    return {f.id: f.severity for f in diagnosis.findings}


def _edit(trace: TraceReport, **rank_fields: Any) -> TraceReport:
    rank = dataclasses.replace(trace.ranks[0], **rank_fields)
    return dataclasses.replace(trace, ranks=(rank,))


def test_resnet_num_workers_0_is_dataloader_bound(fixtures_dir: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, RESNET_W0), env={}))
    top = diagnosis.findings[0]
    assert top.id == "input.dataloader_bound"
    assert top.severity is Severity.HIGH
    assert top.fix is not None
    assert top.fix.id == "dataloader.tuning"
    assert top.fix.params["num_workers"] >= 2
    # The gain is the time ledger's DataLoader row (the GPU idle while the host waits in the
    # DataLoader, 28.7 % of the window), no longer the host's share of step time in it
    # (39.9 %): the ledger's rows are what every finding's gain is taken from (issue 21).
    trace = _trace(fixtures_dir, RESNET_W0)
    assert top.estimated_gain == pytest.approx(trace.ledger().share(DATALOADER_IDLE))
    assert 0.25 < top.estimated_gain < 0.40
    assert diagnosis.recommended()[0].id == "dataloader.tuning"


def test_resnet_num_workers_4_is_not_dataloader_bound(fixtures_dir: Path) -> None:
    found = _findings(_trace(fixtures_dir, RESNET_W4))
    assert "input.dataloader_bound" not in found


@pytest.mark.parametrize("name", [RESNET_W0, RESNET_W4])
def test_fp32_resnet_on_v100_gets_fp16_not_bf16(fixtures_dir: Path, name: str) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, name), env={}))
    precision = [f for f in diagnosis.findings if f.id == "precision.fp32_on_tensor_cores"]
    assert len(precision) == 1
    assert precision[0].severity is Severity.HIGH
    # V100 (cc 7.0) has fp16 tensor cores only: bf16/TF32 advice would be wrong there.
    assert precision[0].fix is not None
    assert precision[0].fix.id == "precision.fp16"


def test_fp32_sgemm_on_a100_gets_bf16(fixtures_dir: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, ALEXNET_A100), env={}))
    precision = [f for f in diagnosis.findings if f.id == "precision.fp32_on_tensor_cores"]
    assert len(precision) == 1
    assert precision[0].fix is not None
    assert precision[0].fix.id == "precision.bf16"
    assert "tf32" in precision[0].instruction.lower()


def test_precision_rule_is_silent_without_tensor_cores(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, RESNET_W0)
    pascal = tuple(
        dataclasses.replace(d, compute_capability=(6, 1)) for d in trace.ranks[0].devices
    )
    assert "precision.fp32_on_tensor_cores" not in _findings(_edit(trace, devices=pascal))


def test_control_trace_has_no_high_finding_but_its_exposed_communication(
    fixtures_dir: Path,
) -> None:
    # 18.3 % of its span is exposed communication: a gain of over a tenth of the run, HIGH by
    # the README's scale; nothing else on it earns more than LOW.
    found = _findings(_trace(fixtures_dir, CONTROL_A100))
    assert found.pop("comm.exposed") is Severity.HIGH
    assert Severity.HIGH not in found.values()


def test_item_in_step_is_named(fixtures_dir: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, TEST_V100), env={}))
    sync = next(f for f in diagnosis.findings if f.id == "sync.host_sync_in_step")
    assert ".item()" in sync.message
    assert sync.fix is not None
    assert sync.fix.id == "sync.remove"
    # 160 ms of 744 ms of steps wait in .item(), but the GPU keeps running queued work through
    # those waits: what the user loses is the GPU idle the waits leave, about none here.
    evidence = {e.name: e.value for e in sync.evidence}
    # (Labels renamed so that each says what it is: issue 20, item 6.)
    assert evidence["host time in the waits"] > 150
    assert evidence["GPU idle in the gaps the waits leave after them"] < 1.0
    assert sync.severity is Severity.LOW


def _with_row(trace: TraceReport, bucket: str, share: float) -> TraceReport:
    """The trace with ``share`` of its window moved onto one idle row of its time ledger
    (taken from the largest row, so the rows still sum to the window)."""
    rank = trace.ranks[0]
    ledger = rank.ledger
    assert ledger is not None
    moved = share * ledger.window_us
    rows = [dataclasses.replace(ledger.rows[0], us=ledger.rows[0].us - moved)]
    rows += [r for r in ledger.rows[1:] if r.bucket != bucket]
    rows.append(LedgerRow(bucket, "idle", moved + ledger.us(bucket)))
    edited = dataclasses.replace(ledger, rows=tuple(sorted(rows, key=lambda r: -r.us)))
    return _edit(trace, ledger=edited)


def test_a_wait_that_drains_the_gpu_is_costed_by_the_idle_it_leaves(fixtures_dir: Path) -> None:
    # The sync finding's gain is the time ledger's sync row: the GPU idle while the host is
    # blocked in the waits, before the wait began as well as after (issue 21, class 2; before,
    # only the gap each wait left after it counted). A planted 8 % of the window there:
    trace = _with_row(_trace(fixtures_dir, RESNET_W4), SYNC_IDLE, 0.08)
    sync = next(
        f
        for f in run_rules(EvidenceBundle(trace=trace, env={})).findings
        if f.id == "sync.host_sync_in_step"
    )
    assert sync.estimated_gain == pytest.approx(trace.ledger().share(SYNC_IDLE))
    assert 0.08 <= sync.estimated_gain < 0.09
    assert sync.severity is Severity.MEDIUM
    assert sync.claims == (SYNC_IDLE,)


def test_sync_call_site_from_stack(fixtures_dir: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, RESNET_W0), env={}))
    sync = next(f for f in diagnosis.findings if f.id == "sync.host_sync_in_step")
    assert sync.fix is not None
    assert sync.fix.params["call_site"] == "resnet50_profiler_api.py(44): <module>"
    assert sync.severity is Severity.LOW  # 0.5 ms of 1 s


def test_sync_rule_counts_a_planted_item(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, RESNET_W4)
    step = trace.steps()[0]
    planted = SyncEvent(
        "aten::_local_scalar_dense",
        "op",
        step.start_us,
        0.3 * step.duration_us,
        step.number,
        "aten::item",
        "train.py(12): step",
    )
    edited = _edit(trace, syncs=(planted,))
    diagnosis = run_rules(EvidenceBundle(trace=edited, env={}))
    sync = next(f for f in diagnosis.findings if f.id == "sync.host_sync_in_step")
    assert sync.fix is not None
    assert sync.fix.params["call_site"] == "train.py(12): step"


def test_exposed_communication_on_multinode_trace(fixtures_dir: Path) -> None:
    found = _findings(_trace(fixtures_dir, MULTINODE_A100))
    assert "comm.exposed" in found  # 13 % communication, 1 % of it overlapped


def test_overlapped_communication_is_not_flagged(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, MULTINODE_A100)
    rank = trace.ranks[0]
    assert rank.breakdown is not None
    # The same communication time, 97 % of it under compute: 0.4 % of the span exposed.
    comm = sum(v for k, v in rank.busy_by_category_set.items() if "communication" in k)
    hidden = {"compute+communication": 0.97 * comm, "communication": 0.03 * comm}
    by_set = {k: v for k, v in rank.busy_by_category_set.items() if "communication" not in k}
    edited = _edit(
        trace,
        busy_by_category_set={**by_set, **hidden},
        breakdown=dataclasses.replace(rank.breakdown, communication_us=0.03 * comm),
    )
    assert "comm.exposed" not in _findings(edited)


def test_exposed_communication_arithmetic_on_hta_control(fixtures_dir: Path) -> None:
    # HTA's trace_diff control (A100, rank 3 of 8). Time by category set, in us, over a
    # 383,404 us span: communication alone 69,110, with compute 55,152, with memory 1,087, with
    # compute and memory 7,161 -> total 132,510 (34.6 %), overlapped 62,313 (47.0 %), exposed
    # 70,197 (18.3 %) = total x (1 - overlap). The gain is the exposed share, not less.
    trace = _trace(fixtures_dir, CONTROL_A100)
    diagnosis = run_rules(EvidenceBundle(trace=trace, env={}), only=["comm.exposed"])
    (finding,) = diagnosis.findings
    values = {e.name: e.value for e in finding.evidence}
    assert values["communication"] == pytest.approx(34.6)
    assert values["communication overlapped by compute"] == pytest.approx(47.0)
    assert values["exposed communication"] == pytest.approx(18.3)
    assert finding.estimated_gain == pytest.approx(70197 / 383404)
    assert "34.6%" in finding.message
    assert "18.3%" in finding.message
    assert finding.severity is Severity.HIGH  # a gain from 10 % of the run (README)
    comm = trace.communication()
    assert comm is not None
    assert comm.overlap is not None
    assert comm.total_share is not None
    assert comm.total_share * (1 - comm.overlap) == pytest.approx(comm.exposed_share)


def test_launch_bound_suggests_compile_reduce_overhead(fixtures_dir: Path) -> None:
    # The launch rule claims the time ledger's launch-overhead row (3.7 % here); planted at
    # 35 % of the window (before: an edit of the launch statistics' short host-wait share).
    trace = _trace(fixtures_dir, RESNET_W4)
    assert isinstance(trace.ranks[0].launches, LaunchStats)
    edited = _with_row(trace, LAUNCH_IDLE, 0.35)
    diagnosis = run_rules(EvidenceBundle(trace=edited, env={}))
    launch = next(f for f in diagnosis.findings if f.id == "launch.launch_bound")
    assert launch.severity is Severity.HIGH
    assert launch.fix is not None
    assert launch.fix == Fix("compile", mode="reduce-overhead")
    assert "launch.launch_bound" not in _findings(trace)


def test_low_utilization(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, RESNET_W4)
    b = trace.ranks[0].breakdown
    assert isinstance(b, TimeBreakdown)
    assert "gpu.low_utilization" not in _findings(trace)  # 82 % compute
    idle = dataclasses.replace(b, span_us=b.span_us * 3)
    assert "gpu.low_utilization" in _findings(_edit(trace, breakdown=idle))


def test_low_occupancy_custom_kernel_gets_block_size(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, RESNET_W4)
    kernel = trace.ranks[0].kernels[3]  # an ATen elementwise kernel, 7 % of kernel time
    hot = dataclasses.replace(
        kernel,
        name="my_fused_kernel(float*, int)",
        share=0.2,
        total_us=kernel.total_us / kernel.share * 0.2,
        block=(64, 1, 1),
        registers_per_thread=32,
        shared_memory_bytes=40 * 1024,
        # What the occupancy calculator gives for this launch on a V100 (cc 7.0).
        theoretical_occupancy=0.0625,
        occupancy_limited_by=("shared_memory",),
    )
    diagnosis = run_rules(EvidenceBundle(trace=_edit(trace, kernels=(hot,)), env={}))
    occ = next(f for f in diagnosis.findings if f.id == "occupancy.low")
    # A claim on the ledger: the kernel's time (on the memory-bound row, where its time lies)
    # x the quarter more warps are taken to win, over the window; severity by that gain.
    ledger = trace.ledger()
    rows = ledger.us(MEMORY_BOUND_WORK, OTHER_KERNELS)
    assert occ.claims == (MEMORY_BOUND_WORK, OTHER_KERNELS)
    assert occ.estimated_gain == pytest.approx(min(hot.total_us, rows) * 0.25 / ledger.window_us)
    assert 0.03 <= occ.estimated_gain < 0.10
    assert occ.severity is Severity.MEDIUM
    assert "limited by shared_memory" in occ.message
    assert "launch with 1024 threads per block (100% occupancy" in occ.instruction
    # Library kernels (cuDNN here) tune their own occupancy: no advice for them.
    assert "occupancy.low" not in _findings(trace)


def test_trace_without_dataloader_events_reports_dataloader_not_evaluated(
    fixtures_dir: Path,
) -> None:
    # The DataLoader rule needs no ProfilerStep ranges any more (issue 21, class 3): what the
    # AlexNet capture lacks is DataLoader events, and that is what it says.
    diagnosis = run_rules(EvidenceBundle(trace=_trace(fixtures_dir, ALEXNET_A100), env={}))
    missing = {n.rule: n.missing for n in diagnosis.not_evaluated}
    assert "DataLoader events" in missing["input.dataloader"]
    assert "input.dataloader_bound" not in diagnosis.ids()


def test_step_outliers_on_v100_test_trace(fixtures_dir: Path) -> None:
    # Steps of 82-166 ms (SOURCES.md: mean 124 ms): 166 ms is over 1.5x the median.
    assert _findings(_trace(fixtures_dir, TEST_V100))["steps.outliers"] is Severity.LOW
    assert "steps.outliers" not in _findings(_trace(fixtures_dir, RESNET_W0))


def test_straggler_rank_is_reported(fixtures_dir: Path) -> None:
    trace = _trace(fixtures_dir, CONTROL_A100)
    assert "steps.stragglers" not in _findings(trace)
    edited = dataclasses.replace(trace, stragglers=(trace.ranks[0].rank,))
    assert _findings(edited)["steps.stragglers"] is Severity.MEDIUM


def test_memory_headroom_unused_needs_both_low_memory_and_low_compute(fixtures_dir: Path) -> None:
    from gpudiag.doctor import diagnose
    from gpudiag.probe.system import inspect

    alexnet = (
        fixtures_dir
        / "traces"
        / "hta-critical_path-alexnet-benchmark_result_2869224_1695835535_trace.json.gz"
    )
    roomy = inspect(
        replay=fixtures_dir / "nvidia-smi-xml" / "a100-sxm4-v12.xml"
    )  # 50 MiB of 80 GiB
    full = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "dual_a5000-v13.xml")  # 22 of 24 GiB
    found = diagnose(trace=alexnet, system=roomy, env={})
    headroom = [f for f in found.findings if f.id == "memory.headroom_unused"]
    assert headroom
    assert headroom[0].evidence[1].value < 50
    assert headroom[0].fix is None  # a trace alone: no workload a trial could resize
    # both A5000s hold most of their memory (92 % and 70 %): no room to grow the batch
    assert "memory.headroom_unused" not in diagnose(trace=alexnet, system=full, env={}).ids()


def test_memory_headroom_offers_twice_the_workloads_batch(fixtures_dir: Path) -> None:
    from gpudiag.probe.system import inspect
    from gpudiag.workloads import mlp

    alexnet = _trace(fixtures_dir, ALEXNET_A100)
    roomy = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "a100-sxm4-v12.xml")
    evidence = EvidenceBundle(
        system=roomy, trace=alexnet, workload=mlp.build(batch_size=24), env={}
    )
    (finding,) = run_rules(evidence, only=["memory.headroom_unused"]).findings
    assert finding.fix is not None
    assert finding.fix == Fix("batch.size", micro_batch=48)
