"""fsdp.wrap inside a process group: fully_shard per block class, then the root (real gloo)."""

from __future__ import annotations

import pytest
import torch

from gpudiag import workloads
from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import Fix
from tests.fakes.machines import cpu_system


def test_fsdp_wrap_shards_the_repeated_blocks_and_trains(one_rank_group: None) -> None:
    from torch.distributed.tensor import DTensor

    wl = workloads.get("gpt", seq_len=16, d_model=32, n_layer=2, vocab_size=64)
    model = wl.model
    fix = Fix("fsdp.wrap")
    assert fix.tryable(cpu_system()) == (True, "")
    applied = fix.apply(model, check=False)
    assert any("fully_shard on 2 Block and the root" in n for n in applied.notes)
    assert type(model.blocks[0]).__name__ == "FSDPBlock"
    assert all(isinstance(p, DTensor) for p in model.parameters())
    batch = wl.make_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = float(model(**batch).loss.detach())
    for _ in range(3):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    assert float(model(**batch).loss.detach()) < first


def test_named_classes_and_mixed_precision(one_rank_group: None) -> None:
    wl = workloads.get("gpt", seq_len=16, d_model=32, n_layer=2, vocab_size=64)
    with pytest.raises(UnsupportedFixError, match="no module of class Nope"):
        Fix("fsdp.wrap", wrap_classes=["Nope"]).apply(wl.model, check=False)
    wl = workloads.get("gpt", seq_len=16, d_model=32, n_layer=2, vocab_size=64)
    fix = Fix("fsdp.wrap", wrap_classes=["Block"], mixed_precision="bf16")
    fix.apply(wl.model, check=False)
    logits = wl.model(**wl.make_batch()).logits
    assert logits.dtype == torch.bfloat16  # parameters gathered in bf16 for the forward


def test_fsdp_code_is_what_a_training_script_runs() -> None:
    lines = Fix(
        "fsdp.wrap", wrap_classes=["Block"], reshard_after_forward=False, mixed_precision="bf16"
    ).code()
    text = "\n".join(lines)
    assert "type(m).__name__ in {'Block'}" in text
    assert "fully_shard(block, reshard_after_forward=False, mp_policy=mp)" in text
    assert "param_dtype=torch.bfloat16, reduce_dtype=torch.float32" in text
    assert "Shards blocks of class Block" in Fix("fsdp.wrap", wrap_classes=["Block"]).describe()


@pytest.mark.parametrize("reshard", [True, False])
def test_the_root_keeps_torchs_default_resharding(
    monkeypatch: pytest.MonkeyPatch, reshard: bool
) -> None:
    """reshard_after_forward goes to the blocks only: torch 2.11's backward fails on a root
    resharded after forward that holds a tied embedding (the demo GPT's), 2.13's does not."""
    import torch.distributed.fsdp as fsdp

    from gpudiag.fixes.fsdp import shard_blocks

    calls: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(
        fsdp, "fully_shard", lambda module, **kw: calls.append((type(module).__name__, kw))
    )
    wl = workloads.get("gpt", seq_len=16, d_model=32, n_layer=2, vocab_size=64)
    shard_blocks(wl.model, {"reshard_after_forward": reshard, "mixed_precision": "none"})
    assert calls == [
        ("Block", {"reshard_after_forward": reshard}),
        ("Block", {"reshard_after_forward": reshard}),
        ("TinyGPT", {}),
    ]
    code = Fix("fsdp.wrap", reshard_after_forward=reshard).code()
    assert code[-1].startswith("fully_shard(model)  # the root")
