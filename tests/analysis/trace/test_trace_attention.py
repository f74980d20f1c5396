"""Attention read from the operator tree: eager (hand-written, SDPA math) or fused, and its time.

Hugging Face vision models with eager attention are not among the recorded traces, so a small
hand-written attention module is profiled here for real (torch.profiler on the CPU); the
recorded traces check the fused backends and a softmax that is not attention.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.profiling import profile


class EagerAttention(torch.nn.Module):
    """Multi-head self-attention written out by hand, as Hugging Face's eager models do."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _merge(self, ctx: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = ctx.shape
        return self.out(ctx.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(mask, float("-inf"))
        probs = F.dropout(torch.softmax(scores, dim=-1), p=0.1, training=self.training)
        return self._merge(torch.matmul(probs, v))


class Gpt2StyleAttention(EagerAttention):
    """Laid out as Hugging Face GPT-2's eager attention: a torch.full scale, a causal mask
    applied with torch.where, softmax in fp32 cast back, dropout."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        lowest = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(~mask, w, lowest)
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(v.dtype)
        w = F.dropout(w, p=0.1, training=self.training)
        return self._merge(torch.matmul(w, v))


class SdpaAttention(EagerAttention):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        return self._merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class SoftmaxGate(torch.nn.Module):
    """A softmax that is not attention: mixture weights, then one matmul (a convex sum)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, torch.softmax(self.logits, dim=0)[: x.shape[-1]].repeat(16))


def _profile(
    module: torch.nn.Module, tmp_path: Path, *, math_backend: bool = False, seq: int = 128
) -> Any:
    """Two profiled steps of ``module`` over a batch of 2 sequences of ``seq`` tokens."""
    torch.manual_seed(0)
    x = torch.randn(2, seq, 64)
    mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)

    def step() -> None:
        module(x, mask).sum().backward()

    if not math_backend:
        return profile(step, steps=2, warmup=1, trace_dir=str(tmp_path))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return profile(step, steps=2, warmup=1, trace_dir=str(tmp_path))


def test_hand_written_attention_is_found_in_the_op_tree(tmp_path: Path) -> None:
    use = _profile(EagerAttention(), tmp_path).attention()
    assert use.eager_calls == 2  # one per profiled step
    assert use.pattern[0] == "aten::matmul"
    assert use.pattern[-1] == "aten::matmul"
    assert "aten::softmax" in use.pattern
    assert "aten::masked_fill" in use.pattern
    assert use.timed_on == "host"  # a CPU-only trace: the operators' own time
    assert 0 < use.softmax_us < use.forward_us
    # Softmax backward ran (measured); the products' backward is estimated on top of it.
    assert 0 < use.backward_measured_us < use.backward_us
    assert use.fused_calls == 0


def test_gpt2_style_eager_attention_is_found(tmp_path: Path) -> None:
    use = _profile(Gpt2StyleAttention(), tmp_path).attention()
    assert use.eager_calls == 2
    assert {"aten::full", "aten::where", "aten::softmax"} <= set(use.pattern)


def test_sdpa_is_fused_not_eager(tmp_path: Path) -> None:
    use = _profile(SdpaAttention(), tmp_path).attention()
    assert use.eager_calls == 0
    assert use.math_calls == 0
    assert use.fused_calls == 2
    assert use.fused_backends == ("flash",)  # SDPA's flash backend runs on the CPU
    assert use.fused_us > 0


def test_sdpa_math_path_is_told_apart_from_hand_written(tmp_path: Path) -> None:
    use = _profile(SdpaAttention(), tmp_path, math_backend=True).attention()
    assert use.math_calls == 2
    assert use.eager_calls == 0
    assert use.math_us > 0


def test_a_softmax_without_two_matmuls_is_not_attention(tmp_path: Path) -> None:
    use = _profile(SoftmaxGate(), tmp_path).attention()
    assert use.eager_calls == 0
    assert use.math_calls == 0


@pytest.fixture(scope="module")
def recorded(fixtures_dir: Path) -> Any:
    cache: dict[str, TraceReport] = {}

    def get(name: str) -> TraceReport:
        if name not in cache:
            cache[name] = analyze_trace(fixtures_dir / "traces" / name)
        return cache[name]

    return get


def test_convex_sum_softmax_in_a_real_trace_is_not_attention(recorded: Any) -> None:
    # Rank 0 of the 128-rank job: aten::softmax then one aten::matmul under fb::convex_sum.
    trace = recorded("hta-trace_filter-2of128-ranks")
    assert "aten::softmax" in {o.name for o in trace.top_cpu_ops(10_000)}
    assert trace.attention().eager_calls == 0


def test_mi300x_qwen_runs_sdpa_flash_on_the_gpu(recorded: Any) -> None:
    # TraceLens' SDPA_fwd table for this trace: aten::_scaled_dot_product_flash_attention.
    use = recorded("tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz").attention()
    assert use.eager_calls == 0
    assert use.fused_calls == 24
    assert use.fused_backends == ("flash",)
    assert use.timed_on == "gpu"
    assert use.fused_us > 0


def test_attention_travels_in_to_dict(recorded: Any) -> None:
    data = recorded("tracelens-torch_compile_triton.json.gz").to_dict()
    attention = data["ranks"][0]["attention"]
    assert attention["fused_calls"] == 1
    assert "matmul_rows" not in attention


def test_graph_replayed_attention_kernels_are_counted_apart(recorded: Any) -> None:
    # vLLM decode in one full graph: only the graph launch is recorded, no operator launches
    # its kernels. Its attention is vLLM's Triton unified attention, 12 + 12 kernels.
    use = recorded("tracelens-inference-vllm_decode_full-graph_execution.json.gz").attention()
    assert use.fused_calls == 0
    assert use.unlaunched_kernels == 24
    assert use.unlaunched_libraries == ("Triton",)
    assert use.unlaunched_us == pytest.approx(493.906 + 161.786, abs=0.01)
    assert use.found
    assert use.to_dict()["unlaunched_kernels"] == 24


def test_kernels_queued_before_the_capture_do_not_change_the_call_count(recorded: Any) -> None:
    # 11 attn_fwd kernels of the Qwen trace ran before its first recorded operator: their
    # launches predate the capture. The SDPA calls stay TraceLens' 24. Before the window was
    # the step's own GPU work (TraceLens' window), the 11 were counted apart as "unlaunched";
    # now they are outside the window, which says so.
    report = recorded("tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz")
    use = report.attention()
    assert use.fused_calls == 24
    assert use.unlaunched_kernels == 0
    assert "463 GPU events queued before the first step" in report.rank().window
