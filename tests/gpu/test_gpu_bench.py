"""gd.bench on a real GPU, each figure against the spec table and against a direct torch
timing taken in the same run (CUDA events around torch.mm / Tensor.copy_, no gpudiag code)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import gpudiag as gd
from tests.gpu.conftest import cuda_time_s

pytestmark = pytest.mark.gpu
GIB = 1 << 30
N = 8192

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16", "fp8"])
def test_matmul_against_spec_and_torch_mm(dtype: str, figure: Callable[[str], None]) -> None:
    """gd.bench.matmul vs spec and direct torch.mm"""
    import torch

    result = gd.bench.matmul(dtypes=[dtype], sizes=[N], progress=False, max_time_s=1.5)
    achieved = result.tflops(dtype)
    if achieved is None:
        reason = result.reason(dtype)
        if dtype == "fp8":
            pytest.skip(f"N/A: {reason}")
        pytest.fail(f"{dtype} not measured: {reason}")
    peak = result.peak_tflops(dtype)
    line = f"{dtype} {achieved:.0f} TFLOP/s"
    if peak:
        assert achieved <= peak * 1.05, "faster than the spec table: the timing or the table is off"
        line += f" = {achieved / peak:.0%} of spec {peak:g}"
    if dtype in _TORCH_DTYPES:
        torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
        a = torch.randn(N, N, device="cuda", dtype=torch_dtype)
        b = torch.randn(N, N, device="cuda", dtype=torch_dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            seconds = cuda_time_s(lambda: torch.mm(a, b))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        direct = 2 * N**3 / seconds / 1e12
        line += f"; direct torch.mm {direct:.0f}"
        assert achieved == pytest.approx(direct, rel=0.25)
    figure(line)


def test_copy_bandwidth_against_spec_and_copy(figure: Callable[[str], None]) -> None:
    """gd.bench.bandwidth copy vs spec and direct copy_"""
    import torch

    result = gd.bench.bandwidth(kinds=["copy"], sizes=[GIB], progress=False, max_time_s=1.5)
    achieved = result.gbps("copy")
    assert achieved is not None, result.reason("copy")
    src = torch.ones(GIB // 4, device="cuda")
    dst = torch.empty_like(src)
    direct = 2 * GIB / cuda_time_s(lambda: dst.copy_(src)) / 1e9
    fraction = result.fraction_of_theoretical("copy")
    spec = f" = {fraction:.0%} of spec" if fraction is not None else " (no spec figure)"
    assert fraction is None or fraction <= 1.05
    assert achieved == pytest.approx(direct, rel=0.2)
    figure(f"copy {achieved:.0f} GB/s{spec}; direct copy_ {direct:.0f} GB/s")


def test_host_device_bandwidth_against_pcie(figure: Callable[[str], None]) -> None:
    """gd.bench.bandwidth host<->device vs the PCIe link"""
    kinds = ["h2d_pinned", "d2h_pinned", "h2d_pageable"]
    result = gd.bench.bandwidth(
        kinds=kinds, sizes=[256 << 20], progress=False, max_time_s=1.0, system=gd.inspect()
    )
    parts = []
    for kind in kinds:
        gbps = result.gbps(kind)
        assert gbps is not None, result.reason(kind)
        fraction = result.fraction_of_theoretical(kind)
        assert fraction is None or fraction <= 1.1
        parts.append(f"{kind} {gbps:.1f} GB/s" + (f" ({fraction:.0%})" if fraction else ""))
    figure("; ".join(parts))


def test_attention_backends(figure: Callable[[str], None]) -> None:
    """gd.bench.attention flash / efficient / cudnn / math"""
    seq = 4096
    result = gd.bench.attention(
        seq_lens=[seq],
        backends=["flash", "efficient", "cudnn", "math"],
        dtype="bf16",
        progress=False,
        max_time_s=1.0,
    )
    parts = []
    for backend in ("flash", "efficient", "cudnn", "math"):
        row = result.row(backend, seq)
        if row.ran:
            assert row.correct, f"{backend}: max relative error {row.max_rel_error}"
            parts.append(f"{backend} {row.forward_ms:.2f} ms")
        else:
            parts.append(f"{backend} N/A ({row.reason[:40]})")
    assert result.row("flash", seq).ran, result.reason("flash")  # SDPA flash runs on sm80+
    assert result.fastest(seq) != "math"
    figure(f"seq {seq} fwd: " + ", ".join(parts))


def test_single_rank_nccl_allreduce(figure: Callable[[str], None]) -> None:
    """gd.bench.allreduce, one rank over NCCL"""
    result = gd.bench.allreduce(
        sizes=[1 << 20, 1 << 26], world_size=1, backend="nccl", progress=False, timeout_s=300
    )
    assert not result.error, result.error
    assert result.backend == "nccl"
    assert all(row.wrong in (0, None) for row in result.rows)
    big = max(result.rows, key=lambda r: r.size_bytes)
    figure(f"1 rank: 64 MiB all-reduce {big.time_us:.0f} us, algbw {big.algbw_gbps:.0f} GB/s")
