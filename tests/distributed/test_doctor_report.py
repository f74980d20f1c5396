"""Merging rank evidence: the table, stragglers, expected bus bandwidth, environment mismatches."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpudiag.analysis.nccl import CollectiveResult, rows_from_times
from gpudiag.distributed.doctor import (
    DistributedReport,
    RankEvidence,
    comm_environment,
    expected_bandwidth,
    gpu_facts,
)
from gpudiag.errors import GpuDiagError


def _evidence(rank: int, step_ms: float, **kw: object) -> RankEvidence:
    base = RankEvidence(
        rank=rank,
        local_rank=rank,
        world_size=2,
        host="node-a",
        pid=1000 + rank,
        device=f"cuda:{rank}",
        backend="nccl",
        usable_cpus=16,
        load_average=1.0,
        torch_threads=8,
        gpu="NVIDIA H100 80GB HBM3",
        nvlink_spec_gbps=900.0,
        nvlinks_active=18,
        pcie_gen=5,
        pcie_width=16,
        step_s=tuple(step_ms / 1e3 * f for f in (0.99, 1.0, 1.01)),
        top_ops=(("aten::mm", 12.5),),
        environment={"NCCL_DEBUG": "WARN"},
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _allreduce(busbw_time_s: float) -> CollectiveResult:
    # 64 MiB per rank on 2 ranks, one timing per repetition.
    rows = rows_from_times("all_reduce", 2, "float", 4, [(16 << 20, [busbw_time_s] * 3, 0, True)])
    return CollectiveResult("all_reduce", 2, "nccl", "measured", rows)


def test_expected_bus_bandwidth_follows_the_links() -> None:
    two = [_evidence(0, 10), _evidence(1, 10)]
    nv = expected_bandwidth(two)
    assert nv.busbw_gbps == pytest.approx(450.0)
    assert "NVLink" in nv.basis
    down = expected_bandwidth([replace(e, nvlinks_active=0) for e in two])
    assert "PCIe" in down.basis
    assert "not read" not in down.basis
    pcie = expected_bandwidth([replace(e, nvlink_spec_gbps=None) for e in two])
    assert pcie.busbw_gbps == pytest.approx(63.0, rel=0.02)
    assert "PCIe" in pcie.basis
    cpu = expected_bandwidth([replace(e, gpu="", device="cpu") for e in two])
    assert cpu.busbw_gbps is None
    assert "gloo" in cpu.basis
    nodes = expected_bandwidth([two[0], replace(two[1], host="node-b")])
    assert nodes.busbw_gbps is None
    assert "network" in nodes.basis
    assert expected_bandwidth(two[:1]).busbw_gbps is None


def test_merge_names_the_straggler_the_slow_collective_and_the_mismatch() -> None:
    slow = _evidence(
        1,
        14,
        clock_reasons=("sw_power_cap",),
        environment={"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1"},
    )
    # 64 MiB in 10 ms on 2 ranks: algbw 6.7 GB/s, busbw the same (factor 1): far below 450.
    report = DistributedReport.merge(
        [slow, _evidence(0, 10)], backend="nccl", collective=_allreduce(0.010)
    )
    assert [r.rank for r in report.ranks] == [0, 1]
    assert [s.rank for s in report.stragglers] == [1]
    assert "sw_power_cap" in report.stragglers[0].reasons[0]
    assert report.measured_busbw_gbps == pytest.approx(6.71, rel=0.01)
    assert report.busbw_share == pytest.approx(6.71 / 450, rel=0.01)
    found = report.findings()
    assert any("NCCL_P2P_DISABLE differs" in f and "rank 0: unset" in f for f in found)
    assert any("of the 450 GB/s" in f for f in found)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["world_size"] == 2
    assert len(doc["ranks"]) == 2
    assert doc["ranks"][1]["clock_reasons"] == ["sw_power_cap"]
    assert doc["ranks"][0]["top_ops"] == [{"op": "aten::mm", "self_ms": 12.5}]
    assert doc["stragglers"][0]["rank"] == 1
    text = repr(report)
    assert "2 ranks on 1 host" in text
    assert "[sw_power_cap]" in text
    assert "450 GB/s" in text


def test_a_rank_that_failed_is_reported_not_timed_and_html_is_escaped() -> None:
    broken = _evidence(1, 0, step_s=(), error="workload failed: <boom>", host="<b>")
    report = DistributedReport.merge([_evidence(0, 10), broken], backend="gloo")
    assert report.stragglers == ()
    assert "rank 1: workload failed: <boom>" in report.findings()
    html = report._repr_html_()
    assert "&lt;boom&gt;" in html
    assert "<boom>" not in html
    assert "&lt;b&gt;" in html
    assert "error" in repr(report)
    assert "collective: not measured" in repr(report)


def test_comm_environment_keeps_only_communication_variables() -> None:
    env = {
        "NCCL_IB_DISABLE": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "HOME": "/root",
        "OMP_NUM_THREADS": "1",
    }
    assert comm_environment(env) == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_IB_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_a_report_survives_its_json_round_trip() -> None:
    report = DistributedReport.merge(
        [_evidence(0, 10), _evidence(1, 14, clock_reasons=("hw_slowdown",))],
        backend="nccl",
        collective=_allreduce(0.010),
        notes=("a note",),
    )
    again = DistributedReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()
    assert again.ranks[1].top_ops == (("aten::mm", 12.5),)
    assert "per size (slowest rank): 64 MiB 10.00 ms" in repr(again)
    with pytest.raises(GpuDiagError, match="not a gpudiag doctor report"):
        DistributedReport.from_dict({"format": "other"})


def test_gpu_evidence_from_a_recorded_two_gpu_machine(fixtures_dir: Path) -> None:
    from gpudiag.probe.system import inspect

    system = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "dual_a5000-v13.xml")
    facts = [gpu_facts(i, system) for i in (0, 1)]
    assert [f["gpu"] for f in facts] == ["NVIDIA RTX A5000"] * 2
    assert facts[0]["gpu_uuid"] != facts[1]["gpu_uuid"]
    assert facts[0]["clock_reasons"] == ("gpu_idle",)
    assert facts[0]["sm_clock_mhz"] == 210
    assert facts[0]["max_sm_clock_mhz"] == 2100
    assert facts[0]["nvlinks_active"] is None  # nvidia-smi -q does not list NVLink state
    ranks = [_evidence(i, 10, **facts[i]) for i in (0, 1)]
    expected = expected_bandwidth(ranks)
    # Gen4 x16 one way (~31.5 GB/s); the A5000's NVLink bridge may or may not be fitted.
    assert expected.busbw_gbps == pytest.approx(31.5, rel=0.02)
    assert "NVLink state not read (up to 56.25 GB/s" in expected.basis
    # An idle GPU is not a throttled one: gpu_idle is no cause for a straggler.
    slow = replace(ranks[1], step_s=(0.02, 0.02, 0.02))
    report = DistributedReport.merge([ranks[0], slow], backend="nccl")
    assert report.stragglers[0].reasons == ()
