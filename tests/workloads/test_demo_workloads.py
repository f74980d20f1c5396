"""The built-in demo workloads: they build, run a step, and look like a user's first version."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.workloads import gpt

TINY: dict[str, dict[str, Any]] = {
    "gpt": {"seq_len": 32, "d_model": 16, "n_head": 2, "n_layer": 1, "vocab_size": 32},
    "mlp": {"batch_size": 8, "in_features": 16, "hidden": 32},
    "cnn": {"batch_size": 4, "image_size": 16, "width": 8},
    "input_bound": {"batch_size": 4, "blur_passes": 1, "crop": 16},
}


def test_registry_names() -> None:
    assert workloads.names() == ("gpt", "mlp", "cnn", "input_bound")
    assert set(TINY) == set(workloads.names())


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_workload_trains_one_step(name: str) -> None:
    wl = workloads.get(name, **TINY[name])
    assert wl.name == name
    assert wl.optimizer_factory is not None
    opt = wl.optimizer_factory(wl.model.parameters())
    batch = next(wl.batches())
    before = [p.detach().clone() for p in wl.model.parameters()]
    loss = wl.loss_fn()(wl.model, batch)
    assert loss.ndim == 0
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, wl.model.parameters(), strict=True))
    assert wl.model.training
    assert next(wl.model.parameters()).dtype == torch.float32  # fp32, as users start


def test_unknown_workload_and_override() -> None:
    with pytest.raises(GpuDiagError, match="choose one of gpt, mlp"):
        workloads.get("resnet")
    with pytest.raises(GpuDiagError, match="seq_len=1024"):
        workloads.get("gpt", sequence=4)


def test_gpt_defaults_to_eager_attention_like_a_first_version() -> None:
    assert workloads.parameters("gpt")["attn_implementation"] == "eager"
    assert workloads.parameters("gpt")["seq_len"] >= 1024
    model = gpt.build(**TINY["gpt"]).model
    assert model.config._attn_implementation == "eager"
    assert model.lm_head.weight is model.tok_emb.weight  # tied, as GPT-2
    assert "blocks.0.attn.causal_mask" not in model.state_dict()  # a non-persistent buffer


def test_gpt_attention_implementations_agree() -> None:
    wl = gpt.build(**TINY["gpt"])
    batch = wl.make_batch()
    model = wl.model
    losses = {}
    for impl in ("eager", "sdpa"):
        model.config._attn_implementation = impl
        losses[impl] = model(**batch).loss
    assert torch.allclose(losses["eager"], losses["sdpa"], rtol=1e-5)
    model.config._attn_implementation = "bogus"
    with pytest.raises(ValueError, match="unknown attention implementation"):
        model(**batch)
    with pytest.raises(ValueError, match="attn_implementation"):
        gpt.build(attn_implementation="xformers")


def test_input_bound_workload_loads_in_the_main_process() -> None:
    wl = workloads.get("input_bound", **TINY["input_bound"])
    assert wl.dataloader is not None
    assert wl.dataloader.num_workers == 0
    assert wl.samples_per_step() == 4
    x, y = next(wl.batches())
    assert x.shape == (4, 3, 16, 16)
    assert y.shape == (4,)
    # per-sample work is deterministic: the same index gives the same image
    ds = wl.dataloader.dataset
    assert torch.equal(ds[3][0], ds[3][0])
