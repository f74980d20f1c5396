"""Collective benchmark: gloo across 2 real local processes, the in-process path, the launcher."""

from __future__ import annotations

import json
import math

import pytest

from gpudiag.analysis.nccl import CollectiveResult
from gpudiag.bench import collectives
from gpudiag.bench.collectives import allreduce, run_collective, safe_iters, torchrun_command
from gpudiag.errors import GpuDiagError


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_in_process_group_checks_every_element(one_rank_group: None, op: str) -> None:
    result = run_collective(op, [4096, 1 << 16], repeats=3, iters=2)
    assert result.op == op
    assert result.world_size == 1
    assert result.backend == "gloo"
    assert [r.size_bytes for r in result.rows] == [4096, 1 << 16]
    for row in result.rows:
        assert row.wrong == 0
        assert row.busbw_gbps == 0.0  # one rank moves nothing over a bus
        assert row.algbw_gbps == pytest.approx(row.size_bytes / (row.time_us * 1e-6) / 1e9)
        assert row.time_q1_us is not None
        assert row.time_q3_us is not None
        assert row.time_q1_us <= row.time_us <= row.time_q3_us
    assert any("one rank" in n for n in result.notes)


def test_allreduce_uses_the_running_group(one_rank_group: None) -> None:
    result = allreduce([4096], repeats=2, iters=1, progress=False)
    assert result.world_size == 1
    assert not result.error


def test_safe_iters_keeps_values_in_range() -> None:
    assert safe_iters("all_gather", "fp16", 8, 20) == 20
    assert safe_iters("all_reduce", "fp32", 2, 20) == 20
    # fp16: start 4 * 8 * 9 / 2 = 144; 144 * 8**(k - 1) must stay below 3e4 -> k = 3.
    assert safe_iters("all_reduce", "fp16", 8, 20) == 3
    k = safe_iters("all_reduce", "fp32", 1024, 50)
    assert 4 * 1024 * 1025 / 2 * 1024 ** (k - 1) < 1e30 < 4 * 1024 * 1025 / 2 * 1024**k


def test_torchrun_command_for_several_nodes() -> None:
    cmd = torchrun_command("allreduce", [1 << 20], nnodes=4, nproc_per_node=8)
    assert cmd == (
        "torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=$MASTER_ADDR:29500 -m gpudiag.bench._collective_worker "
        "--op all_reduce --dtype fp32 --sizes 1048576 --out gpudiag_collective.json"
    )


def test_bad_requests() -> None:
    with pytest.raises(GpuDiagError, match="parse_nccl_tests"):
        torchrun_command("broadcast")
    with pytest.raises(GpuDiagError, match="dtype"):
        allreduce([4096], dtype="int8", progress=False)
    with pytest.raises(GpuDiagError, match="NCCL needs one GPU"):
        allreduce([4096], backend="nccl", world_size=2, progress=False)


@pytest.mark.slow
def test_gloo_allreduce_across_two_real_processes() -> None:
    result = allreduce([4096, 1 << 18], repeats=3, iters=2, progress=False)
    assert not result.error, result.error
    assert (result.op, result.world_size, result.backend, result.source) == (
        "all_reduce",
        2,
        "gloo",
        "measured",
    )
    assert result.bus_factor == 1.0  # 2 (n - 1) / n with n = 2
    for row in result.rows:
        assert row.wrong == 0
        assert row.in_place
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps)
        assert row.busbw_gbps > 0
        low, high = row.busbw_iqr_gbps or (math.nan, math.nan)
        assert low <= row.busbw_gbps <= high
    assert json.loads(json.dumps(result.to_dict()))["world_size"] == 2


@pytest.mark.slow
def test_gloo_reduce_scatter_across_two_real_processes() -> None:
    result = collectives.reduce_scatter([1 << 16], repeats=2, iters=2, progress=False)
    assert not result.error, result.error
    (row,) = result.rows
    assert row.wrong == 0
    assert not row.in_place
    assert row.count == (1 << 16) // 4 // 2  # per-rank output elements
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 0.5)


@pytest.mark.slow
def test_a_failed_launch_is_a_result_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "WORKER_MODULE", "gpudiag.no_such_worker")
    result = allreduce([4096], progress=False, timeout_s=120)
    assert isinstance(result, CollectiveResult)
    assert not result.rows
    assert "2-process run failed" in result.error
    assert "cannot run" in repr(result)
