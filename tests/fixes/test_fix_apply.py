"""Applying and reverting the implemented fixes on the CPU (CUDA-only effects via their flags)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from torch import nn

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import Fix, FixConflictError, apply_fixes
from gpudiag.workloads import gpt


class Probe(nn.Module):
    """Records whether autocast was on inside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        self.seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        return out


def test_bf16_wraps_forward_in_autocast_and_returns_float32(bf16_cpu: Any) -> None:
    model = Probe()
    with Fix("precision.bf16").applied(model, system=bf16_cpu) as applied:
        out = model(torch.randn(2, 4))
        assert applied.scaler is None  # never a GradScaler with bf16
    assert model.seen[-1] == (True, torch.bfloat16)
    assert out.dtype == torch.float32  # cast back so the loss is computed in float32
    model(torch.randn(2, 4))
    assert model.seen[-1] == (False, torch.float32)
    assert "forward" not in vars(model)


def test_bf16_without_a_model_is_autocast_around_the_block(bf16_cpu: Any) -> None:
    with Fix("precision.bf16").applied(system=bf16_cpu):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_fp16_comes_with_a_grad_scaler(make_cpu_system: Any) -> None:
    model = Probe()
    applied = Fix("precision.fp16").apply(model, system=make_cpu_system("avx512_fp16"))
    try:
        assert isinstance(applied.scaler, torch.amp.GradScaler)
        assert any("GradScaler" in n for n in applied.notes)
        model(torch.randn(2, 4))
        assert model.seen[-1] == (True, torch.float16)
    finally:
        applied.revert()
    assert applied.scaler is None


def test_precision_fixes_conflict(bf16_cpu: Any) -> None:
    with pytest.raises(FixConflictError, match="same thing"):
        apply_fixes(
            [Fix("precision.bf16"), Fix("precision.fp16")], Probe(), system=bf16_cpu, check=False
        )


def test_unsupported_fix_is_refused_or_skipped(make_cpu_system: Any) -> None:
    no_bf16 = make_cpu_system("avx2")
    with pytest.raises(UnsupportedFixError, match="AVX512-BF16"):
        Fix("precision.bf16").apply(Probe(), system=no_bf16)
    applied = apply_fixes([Fix("precision.bf16")], Probe(), system=no_bf16, skip_unsupported=True)
    assert applied.fixes == []
    assert "AVX512-BF16" in applied.skipped[0][1]


def test_tf32_and_cudnn_benchmark_flags_set_and_restored() -> None:
    before = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
    )
    with apply_fixes([Fix("precision.tf32"), Fix("cudnn.benchmark")], check=False):
        assert torch.backends.cuda.matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.benchmark
    after = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
    )
    assert after == before


def test_sdpa_backend_restricted_inside_and_restored_after(bf16_cpu: Any) -> None:
    with Fix("attention.backend", backend="math").applied(system=bf16_cpu):
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()


def tiny_gpt() -> nn.Module:
    return gpt.build(seq_len=16, d_model=8, n_head=2, n_layer=1, vocab_size=16).model


def test_hf_style_switch_eager_to_sdpa_and_back(bf16_cpu: Any) -> None:
    model = tiny_gpt()
    batch = gpt.token_batch(2, 16, 16)
    eager = model(**batch).loss
    with Fix.parse("attention.backend=flash").applied(model, system=bf16_cpu) as applied:
        assert model.config._attn_implementation == "sdpa"
        assert all(b.attn.config._attn_implementation == "sdpa" for b in model.blocks)
        fused = model(**batch).loss
        assert any("'eager' to 'sdpa'" in n for n in applied.notes)
    assert model.config._attn_implementation == "eager"
    assert torch.allclose(eager, fused, rtol=1e-5)


def test_attention_fix_on_a_model_without_a_switch_says_so(bf16_cpu: Any) -> None:
    with Fix("attention.backend").applied(nn.Linear(2, 2), system=bf16_cpu) as applied:
        assert any("no attention-implementation switch" in n for n in applied.notes)


def test_flash_attn_path_with_an_import_level_fake(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, ...]] = []

    def flash_attn_func(
        q: Any, k: Any, v: Any, dropout_p: float = 0.0, causal: bool = False
    ) -> Any:
        calls.append(tuple(q.shape))  # (batch, seq, heads, head_dim), as flash-attn takes it
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )
        return out.transpose(1, 2)

    fake = types.ModuleType("flash_attn")
    fake.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    model = tiny_gpt()
    # The recorded CPU cannot run flash-attn (CUDA only): apply without the hardware check.
    with Fix("attention.backend", backend="flash_attn").applied(model, check=False):
        assert model.config._attn_implementation == "flash_attention_2"
        model(**gpt.token_batch(2, 16, 16))
    assert calls == [(2, 16, 2, 4)]
    assert model.config._attn_implementation == "eager"


def test_flash_attn_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn -> ImportError
    with pytest.raises(UnsupportedFixError, match="pip install flash-attn"):
        Fix("attention.backend", backend="flash_attn").apply(tiny_gpt(), check=False)


def test_compile_wraps_the_model_and_leaves_the_original(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_compile(model: Any, **options: Any) -> Any:
        seen.update(options)
        return ("compiled", model)

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = nn.Linear(2, 2)
    applied = Fix("compile", mode="max-autotune").apply(model, system=bf16_cpu)
    assert applied.model == ("compiled", model)
    assert seen == {"mode": "max-autotune", "fullgraph": False}
    applied.revert()
    assert applied.model is model


@pytest.mark.slow
def test_compile_for_real_matches_eager(bf16_cpu: Any) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with Fix("compile").applied(model, system=bf16_cpu) as applied:
        assert applied.model is not model
        assert torch.allclose(applied.model(x), model(x), atol=1e-6)
