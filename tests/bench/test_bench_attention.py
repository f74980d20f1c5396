"""gd.bench.attention: SDPA CPU backends for real; flash-attn and Transformer Engine via fakes."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from typing import Any

import pytest

from gpudiag.bench import sdpa
from gpudiag.bench.sdpa import AttentionResult, attention, attention_flops
from gpudiag.errors import GpuDiagError

SMALL: dict[str, Any] = {
    "batch": 1,
    "heads": 2,
    "head_dim": 16,
    "dtype": "fp32",
    "repeats": 2,
    "progress": False,
}


@pytest.fixture(scope="module")
def result() -> AttentionResult:
    return attention([64, 128], ["flash", "efficient", "cudnn", "math"], device="cpu", **SMALL)


def test_cpu_backends_run_forward_and_backward(result: AttentionResult) -> None:
    for backend in ("flash", "math"):
        for seq in (64, 128):
            row = result.row(backend, seq)
            assert row.correct, row.reason
            assert row.forward_ms is not None
            assert row.backward_ms is not None
            assert row.forward_tflops is not None
            assert row.backward_tflops is not None
            assert row.max_rel_error is not None
            assert row.max_rel_error <= sdpa.TOLERANCE["fp32"]
    assert result.fastest(128) in {"flash", "math"}


def test_backends_that_cannot_run_say_why(result: AttentionResult) -> None:
    for backend in ("efficient", "cudnn"):
        assert result.time_ms(backend, 64) is None
        reason = result.reason(backend)
        assert reason.startswith("cannot run")
        assert "CUDA" in reason
    assert "cannot run" in repr(result)


def test_peak_memory_is_measured_on_the_cpu(result: AttentionResult) -> None:
    math_row = result.row("math", 128)
    assert math_row.peak_memory_bytes is not None
    assert math_row.peak_memory_bytes > 0
    assert "profiler" in math_row.peak_memory_source
    # The math backend materialises the S x S attention matrix; it needs more than 64 x 64.
    assert math_row.peak_memory_bytes >= 2 * 128 * 128 * 4


def test_flops_formula() -> None:
    assert attention_flops(1, 2, 128, 16, causal=False) == 4 * 2 * 128 * 128 * 16
    assert attention_flops(1, 2, 128, 16, causal=True) == 2 * 2 * 128 * 128 * 16


def test_json_and_errors(result: AttentionResult) -> None:
    data = json.loads(json.dumps(result.to_dict()))
    assert data["kind"] == "attention"
    html = dataclasses.replace(result, notes=("<i>n</i>",))._repr_html_()
    assert "<i>n" not in html
    assert "&lt;i&gt;n" in html
    assert {r["backend"] for r in data["rows"]} == {"flash", "efficient", "cudnn", "math"}
    with pytest.raises(GpuDiagError, match="No result"):
        result.row("math", 4096)
    with pytest.raises(GpuDiagError, match="Unknown attention backend"):
        attention([64], ["xformers"], device="cpu", **SMALL)


# --- flash-attn and Transformer Engine: import-level fakes (untested on a real GPU) ---------------


def _reference(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """SDPA on (B, S, H, D) tensors, as flash-attn lays them out."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    )
    return out.transpose(1, 2)


@pytest.fixture
def fake_flash_attn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {"n": 0}
    module = types.ModuleType("flash_attn")

    def flash_attn_func(q: Any, k: Any, v: Any, causal: bool = False) -> Any:
        calls["n"] += 1
        calls["causal"] = causal
        calls["shape"] = tuple(q.shape)
        return _reference(q, k, v, causal)

    module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    return calls


def test_flash_attn_path_with_a_fake(fake_flash_attn: dict[str, Any]) -> None:
    r = attention([64], ["flash_attn"], device="cpu", **SMALL)
    row = r.row("flash_attn", 64)
    assert row.correct, row.reason
    assert row.untested_on_gpu
    assert fake_flash_attn["causal"] is True
    assert fake_flash_attn["shape"] == (1, 64, 2, 16)  # (B, S, H, D)
    assert any("untested on a real GPU" in n for n in r.notes)


def test_a_wrong_backend_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("flash_attn")
    module.flash_attn_func = lambda q, k, v, causal=False: _reference(q, k, v, not causal)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    row = attention([64], ["flash_attn"], device="cpu", **SMALL).row("flash_attn", 64)
    assert not row.correct
    assert "wrong result" in row.reason


def test_flash_attn_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    r = attention([64], ["flash_attn"], device="cpu", **SMALL)
    assert "flash-attn not installed" in r.reason("flash_attn")


def test_transformer_engine_path_with_a_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    seen: dict[str, Any] = {}

    class DotProductAttention(torch.nn.Module):
        def __init__(self, num_attention_heads: int, kv_channels: int, **kwargs: Any) -> None:
            super().__init__()
            seen.update(kwargs, heads=num_attention_heads, head_dim=kv_channels)

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            out = _reference(q, k, v, seen["attn_mask_type"] == "causal")
            return out.reshape(q.shape[0], q.shape[1], -1)  # TE returns (B, S, H*D)

    te = types.ModuleType("transformer_engine")
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_pytorch.DotProductAttention = DotProductAttention  # type: ignore[attr-defined]
    te.pytorch = te_pytorch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pytorch)
    row = attention([64], ["te"], device="cpu", **SMALL).row("te", 64)
    assert row.correct, row.reason
    assert row.untested_on_gpu
    assert seen["qkv_format"] == "bshd"
    assert seen["attn_mask_type"] == "causal"
    assert (seen["heads"], seen["head_dim"]) == (2, 16)


def test_transformer_engine_import_failure_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    r = attention([64], ["te"], device="cpu", **SMALL)
    assert "Transformer Engine unavailable" in r.reason("te")
