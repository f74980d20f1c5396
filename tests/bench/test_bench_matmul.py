"""gd.bench.matmul runs for real on the CPU; peaks, dtype support and checks are pinned down."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpudiag.bench import _env, gemm
from gpudiag.bench.gemm import MatmulResult, matmul
from gpudiag.errors import GpuDiagError
from gpudiag.probe.cuda import CudaDeviceProperties
from gpudiag.probe.readings import ok
from gpudiag.probe.system import SystemReport
from tests.fakes.machines import cpu_system


@pytest.fixture(scope="module")
def result() -> MatmulResult:
    return matmul(["fp32", "bf16"], [48, (64, 32, 16)], device="cpu", repeats=3, progress=False)


def test_every_case_runs_and_is_checked(result: MatmulResult) -> None:
    assert [(r.dtype, r.shape) for r in result.rows] == [
        ("fp32", "48x48x48"),
        ("fp32", "64x32x16"),
        ("bf16", "48x48x48"),
        ("bf16", "64x32x16"),
    ]
    for row in result.rows:
        assert row.correct, row.reason
        assert row.max_rel_error is not None
        assert row.max_rel_error <= gemm.TOLERANCE[row.dtype]
        assert row.measurement is not None
        assert row.measurement.n >= 1
        assert row.flops == 2 * row.m * row.n * row.k


def test_tflops_is_the_best_correct_size(result: MatmulResult) -> None:
    for dtype in ("fp32", "bf16"):
        best = max(r.tflops or 0 for r in result.rows if r.dtype == dtype)
        assert result.tflops(dtype) == best
    assert result.tflops("float32") == result.tflops("fp32")  # aliases


def test_unknown_or_unmeasured_dtype_is_a_clear_error(result: MatmulResult) -> None:
    with pytest.raises(GpuDiagError, match="Unknown dtype"):
        result.tflops("int3")
    with pytest.raises(GpuDiagError, match="dtypes="):
        result.tflops("fp16")


def test_tf32_on_a_cpu_is_not_available_with_the_reason() -> None:
    r = matmul(["tf32"], [32], device="cpu", repeats=2, progress=False)
    assert r.tflops("tf32") is None
    assert "TF32" in r.reason("tf32")
    assert not r.rows


def test_a_wrong_product_gets_no_tflops(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(dtype: str, device: str) -> Any:
        import torch

        def mm(ops: tuple[Any, Any, Any]) -> Any:
            return torch.mm(ops[0], ops[1], out=ops[2]).add_(1.0)

        return mm

    monkeypatch.setattr(gemm, "_run_op", broken)
    r = matmul(["fp32"], [32], device="cpu", repeats=2, progress=False)
    assert r.tflops("fp32") is None
    assert r.rows[0].tflops is None
    assert "wrong result" in r.reason("fp32")


def test_report_is_json_and_escaped_html(result: MatmulResult) -> None:
    data = json.loads(json.dumps(result.to_dict()))
    assert data["kind"] == "matmul"
    assert set(data["best_tflops"]) == {"fp32", "bf16"}
    tainted = dataclasses.replace(result, notes=("<script>x</script>",))
    html = tainted._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "MatmulResult on cpu" in repr(result)


def _fake_system(flags: tuple[str, ...], mhz: float = 2000.0) -> SystemReport:
    system = cpu_system(*flags)
    return dataclasses.replace(
        system, host=dataclasses.replace(system.host, cpu_max_mhz=ok(mhz, "test"))
    )


@pytest.mark.parametrize(
    ("flags", "dtype", "expected"),
    [
        (("avx512f", "avx2", "fma"), "fp32", 2 * 2000e6 * 64 / 1e12),
        (("avx512f", "avx512_bf16"), "bf16", 2 * 2000e6 * 128 / 1e12),
        (("avx512f", "amx_bf16"), "bf16", 2 * 2000e6 * 1024 / 1e12),
        (("avx2", "fma"), "fp32", 2 * 2000e6 * 32 / 1e12),
    ],
)
def test_cpu_peak_is_a_labelled_estimate(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], dtype: str, expected: float
) -> None:
    monkeypatch.setattr(_env, "cpu_compute_cores", lambda: 2)
    peak = _env.cpu_peak_tflops(dtype, _fake_system(flags))
    assert peak.ok
    assert peak.value == pytest.approx(expected)
    assert peak.source.startswith("estimate: 2 cores x 2000 MHz")


def test_cpu_peak_is_na_without_the_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "cpu_compute_cores", lambda: 2)
    system = _fake_system(("avx2", "fma"))
    assert not _env.cpu_peak_tflops("bf16", system).ok
    assert "fp16" in _env.cpu_peak_tflops("fp16", system).reason
    assert not _env.cpu_peak_tflops("fp32", _fake_system(())).ok


def test_default_dtypes_follow_the_cpu_flags() -> None:
    cpu = _env.Target("cpu")
    assert gemm.default_dtypes(cpu, _fake_system(("avx512f",))) == ("fp32",)
    assert gemm.default_dtypes(cpu, _fake_system(("avx512_bf16",))) == ("fp32", "bf16")
    assert gemm.default_dtypes(cpu, _fake_system(("amx_bf16", "amx_fp16"))) == (
        "fp32",
        "bf16",
        "fp16",
    )


# --- GPU wiring, against fakes (untested on a real GPU) ------------------------------------------


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int]) -> None:
    from gpudiag.probe import cuda

    props = CudaDeviceProperties(0, "NVIDIA H100 80GB HBM3", "GPU-0", cc, 132, 80 << 30, 50 << 20)
    monkeypatch.setattr(cuda, "device_properties", lambda index: props)


def test_gpu_peak_comes_from_the_spec_table() -> None:
    target = _env.Target("cuda", 0, "NVIDIA H100 80GB HBM3")
    peak = _env.peak_tflops(target, "bf16")
    assert peak.ok
    assert peak.value == pytest.approx(989.5)
    assert "specs" in peak.source
    assert _env.peak_memory_gbps(target).value == pytest.approx(3350)
    unknown = _env.peak_tflops(_env.Target("cuda", 0, "Mystery Accelerator 9000"), "bf16")
    assert not unknown.ok
    assert "spec table" in unknown.reason


def test_gpu_dtype_support_follows_the_compute_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, (7, 0))
    target = _env.Target("cuda", 0, "Tesla V100")
    assert _env.gpu_supports(target, "fp16") == (True, "")
    supported, reason = _env.gpu_supports(target, "tf32")
    assert not supported
    assert "8.0" in reason
    assert "7.0" in reason
    assert gemm.default_dtypes(target) == ("fp32", "fp16")
    _fake_gpu(monkeypatch, (9, 0))
    assert gemm.default_dtypes(target) == ("fp32", "tf32", "bf16", "fp16", "fp8")


def test_gpu_l2_size_sizes_the_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, (9, 0))
    size, source = _env.last_level_cache_bytes(_env.Target("cuda", 0, "H100"))
    assert size == 50 << 20
    assert "L2" in source


def test_matmul_precision_is_restored() -> None:
    import torch

    before = torch.get_float32_matmul_precision()
    with gemm._matmul_precision("tf32"):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before


def test_bad_sizes() -> None:
    with pytest.raises(GpuDiagError, match="Matmul size"):
        matmul(["fp32"], [(1, 2)], device="cpu", progress=False)
