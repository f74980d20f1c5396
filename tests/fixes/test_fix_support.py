"""supported(system): hardware and package gating, on recorded GPUs and hand-built CPUs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpudiag.fixes import Fix
from gpudiag.probe.system import inspect

RECORDED = {
    "t4": "tesla-t4.xml",  # Turing, 7.5
    "a100": "a100-sxm4-v12.xml",  # Ampere, 8.0
    "ada": "rtx-4000-sff-ada-v13.xml",  # Ada, 8.9
    "blackwell": "pro-6000-maxq-blackwell-v13.xml",  # 12.0
    "pascal": "gtx-1070-ti.xml",  # 6.1
}


@pytest.fixture(scope="module")
def gpus(fixtures_dir: Path) -> dict[str, Any]:
    return {k: inspect(replay=fixtures_dir / "nvidia-smi-xml" / f) for k, f in RECORDED.items()}


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make ``import NAME`` find an empty stand-in package (flash-attn, Transformer Engine)."""

    def install(name: str, body: str = "") -> None:
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)

    return install


def supported(text: str, system: Any) -> tuple[bool, str]:
    return Fix.parse(text).supported(system)


def test_tf32_needs_ampere(gpus: dict[str, Any]) -> None:
    ok, why = supported("precision.tf32", gpus["t4"])
    assert not ok
    assert "Tesla T4" in why
    assert "7.5" in why
    assert supported("precision.tf32", gpus["a100"]) == (True, "")


def test_tf32_and_cudnn_are_meaningless_on_a_cpu(make_cpu_system: Any) -> None:
    cpu = make_cpu_system("avx512_bf16")
    assert not supported("precision.tf32", cpu)[0]
    assert "cuDNN" in supported("cudnn.benchmark", cpu)[1]


def test_bf16_on_gpus_and_cpus(gpus: dict[str, Any], make_cpu_system: Any) -> None:
    assert not supported("precision.bf16", gpus["t4"])[0]
    assert "precision.fp16" in supported("precision.bf16", gpus["t4"])[1]
    assert supported("precision.bf16", gpus["a100"])[0]
    assert supported("precision.bf16", make_cpu_system("avx512_bf16"))[0]
    assert supported("precision.bf16", make_cpu_system("amx_bf16", "amx_tile"))[0]
    ok, why = supported("precision.bf16", make_cpu_system("avx2", "avx512f"))
    assert not ok
    assert "AVX512-BF16" in why


def test_fp16_needs_tensor_cores(gpus: dict[str, Any], make_cpu_system: Any) -> None:
    assert not supported("precision.fp16", gpus["pascal"])[0]
    assert supported("precision.fp16", gpus["t4"])[0]
    assert not supported("precision.fp16", make_cpu_system("avx512_bf16"))[0]
    assert supported("precision.fp16", make_cpu_system("avx512_fp16"))[0]


def test_fp8_needs_cc_8_9_and_transformer_engine(gpus: dict[str, Any], fake_package: Any) -> None:
    ok, why = supported("precision.fp8", gpus["a100"])
    assert not ok
    assert "8.9" in why
    ok, why = supported("precision.fp8", gpus["ada"])
    assert not ok
    assert "Transformer Engine" in why
    fake_package("transformer_engine")
    assert supported("precision.fp8", gpus["ada"]) == (True, "")
    assert supported("precision.fp8", gpus["blackwell"]) == (True, "")
    assert Fix("precision.fp8").tryable(gpus["ada"]) == (True, "")


def test_attention_backends_by_hardware(
    gpus: dict[str, Any], make_cpu_system: Any, fake_package: Any
) -> None:
    cpu = make_cpu_system("avx512_bf16")
    assert supported("attention.backend=flash", cpu) == (True, "")  # torch's CPU flash kernel
    assert "CPU" in supported("attention.backend=efficient", cpu)[1]
    assert supported("attention.backend=math", cpu)[0]
    assert not supported("attention.backend=flash", gpus["t4"])[0]
    assert supported("attention.backend=efficient", gpus["t4"])[0]
    ok, why = supported("attention.backend=flash_attn", gpus["a100"])
    assert not ok
    assert "pip install flash-attn" in why
    fake_package("flash_attn")
    assert supported("attention.backend=flash_attn", gpus["a100"]) == (True, "")
    assert not supported("attention.backend=flash_attn", gpus["t4"])[0]


def test_compile_needs_a_compiler_on_the_cpu(
    make_cpu_system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudiag.fixes import compile as compile_fix

    cpu = make_cpu_system()
    monkeypatch.setattr(compile_fix, "cxx_compiler", lambda: None)
    ok, why = supported("compile", cpu)
    assert not ok
    assert "C++ compiler" in why
    monkeypatch.setattr(compile_fix, "cxx_compiler", lambda: "g++")
    assert supported("compile", cpu) == (True, "")


def test_compile_on_a_gpu_needs_triton(gpus: dict[str, Any], fake_package: Any) -> None:
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        assert "Triton" in supported("compile", gpus["a100"])[1]
        fake_package("triton")
    assert supported("compile", gpus["a100"]) == (True, "")
    assert "7.0" in supported("compile", gpus["pascal"])[1]


def test_environment_fixes_are_gpu_only(gpus: dict[str, Any], make_cpu_system: Any) -> None:
    assert supported("allocator.config", gpus["a100"]) == (True, "")
    assert not supported("allocator.config", make_cpu_system())[0]
    assert not supported("nccl.env:NCCL_ALGO=Ring", make_cpu_system())[0]
