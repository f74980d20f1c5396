"""A small GPT-style language model in fp32, written the way a first version usually is.

Its attention implementation is switchable like a Hugging Face model's
(``model.config._attn_implementation``): ``"eager"`` (the default here: hand-written
softmax(QK^T)V with a causal mask buffer), ``"sdpa"`` (torch's scaled_dot_product_attention)
or ``"flash_attention_2"`` (the flash-attn package; CUDA only).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpudiag.errors import WorkloadError
from gpudiag.step import Workload

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


@dataclass
class GPTConfig:
    vocab_size: int = 512
    seq_len: int = 1024
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.0
    _attn_implementation: str = "eager"


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: float
) -> torch.Tensor:
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    weights = F.dropout(weights, p=dropout)
    return weights @ v


def flash_attention_2(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float
) -> torch.Tensor:
    # optional: pip install flash-attn (CUDA only)
    flash_attn_func = importlib.import_module("flash_attn").flash_attn_func

    # flash-attn takes (batch, seq, heads, head_dim).
    out = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout, causal=True
    )
    return out.transpose(1, 2)


class CausalSelfAttention(nn.Module):
    causal_mask: torch.Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        mask = torch.tril(torch.ones(config.seq_len, config.seq_len, dtype=torch.bool))
        self.register_buffer(
            "causal_mask", mask.view(1, 1, config.seq_len, config.seq_len), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.config.n_head
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        dropout = self.config.dropout if self.training else 0.0
        impl = self.config._attn_implementation
        if impl == "eager":
            y = eager_attention(q, k, v, self.causal_mask[:, :, :t, :t], dropout)
        elif impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        elif impl == "flash_attention_2":
            y = flash_attention_2(q, k, v, dropout)
        else:
            raise WorkloadError(
                f"unknown attention implementation {impl!r}; use one of {ATTENTION_IMPLEMENTATIONS}"
            )
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied, as in GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> CausalLMOutput:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return CausalLMOutput(loss, logits)


def token_batch(batch_size: int, seq_len: int, vocab_size: int, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=g)
    return {"idx": tokens[:, :-1], "targets": tokens[:, 1:]}


def build(
    *,
    seq_len: int = 1024,
    batch_size: int = 2,
    d_model: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    vocab_size: int = 512,
    dropout: float = 0.0,
    attn_implementation: str = "eager",
    lr: float = 3e-4,
    device: str = "cpu",
    seed: int = 0,
) -> Workload:
    """The demo GPT: fp32, AdamW, eager attention by default; one fixed batch of random tokens."""
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise WorkloadError(f"attn_implementation must be one of {ATTENTION_IMPLEMENTATIONS}")
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size, seq_len, d_model, n_layer, n_head, dropout, attn_implementation)
    model = TinyGPT(config).to(device)
    return Workload(
        model,
        batch=lambda bs: token_batch(bs, seq_len, vocab_size, seed),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
        batch_size=batch_size,
        tokens_per_sample=seq_len,
        name="gpt",
    )
