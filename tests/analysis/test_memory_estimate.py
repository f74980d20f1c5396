"""Closed-form memory formulas against published figures, each with its source."""

from __future__ import annotations

import pytest

from gpudiag.analysis import memory_estimate as me
from gpudiag.errors import GpuDiagError

GB = 1e9


def test_mixed_precision_adam_is_16_bytes_per_parameter() -> None:
    # ZeRO paper (arXiv:1910.02054) section 3.1: 2 + 2 + K with K = 12 for mixed-precision Adam.
    bpp = me.bytes_per_parameter("bf16", "adam")
    assert (bpp.weights, bpp.gradients, bpp.optimizer_state) == (2, 2, 12)
    assert bpp.total == 16
    assert me.bytes_per_parameter("fp32", "adamw").total == 16  # 4 + 4 + 8
    assert me.bytes_per_parameter("fp32", "sgd_momentum").total == 12
    assert me.bytes_per_parameter("bf16", training=False).total == 2


def test_zero_stages_match_figure_1_of_the_paper() -> None:
    # ZeRO Figure 1: 7.5 B parameters, N_d = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
    n = 7.5e9
    states = {
        "parameters": int(2 * n),
        "gradients": int(2 * n),
        "optimizer_state": int(12 * n),
    }
    expected = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected.items():
        par = me.Parallelism(dp=64, zero=stage)
        sharded, _ = me.shard_model_states(states, par)
        assert sum(sharded.values()) / GB == pytest.approx(gb, abs=0.05)


def test_llama2_7b_kv_cache_is_about_2_gb() -> None:
    # NVIDIA, "Mastering LLM Techniques: Inference Optimization" (2023): Llama 2 7B, batch 1,
    # 4096 tokens, fp16: 1 * 4096 * 2 * 32 * 4096 * 2 bytes, about 2 GB.
    cfg = me.TransformerConfig(layers=32, hidden=4096, heads=32, vocab_size=32000, seq_len=4096)
    assert me.kv_cache_bytes(cfg, 1, 4096, element_bytes=2) == 1 * 4096 * 2 * 32 * 4096 * 2
    grouped = me.TransformerConfig(layers=32, hidden=4096, heads=32, kv_heads=8)
    assert me.kv_cache_bytes(grouped, 1, 4096) * 4 == me.kv_cache_bytes(cfg, 1, 4096)


def test_activation_formula_is_the_papers() -> None:
    # Korthikanti et al. 2022, eq. (1)-(3): sbh(34 + 5as/h); TP: sbh(10 + 24/t + 5as/(ht));
    # TP + SP: sbh(34/t + 5as/(ht)) (16-bit activations, dropout).
    cfg = me.TransformerConfig(layers=1, hidden=1024, heads=16)
    s, b, h, a = 2048, 4, 1024, 16
    one = me.activation_bytes_per_layer(cfg, b, s)
    assert one == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    for t in (2, 4, 8):
        tp = me.activation_bytes_per_layer(cfg, b, s, tp=t)
        assert tp == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        sp = me.activation_bytes_per_layer(cfg, b, s, tp=t, sequence_parallel=True)
        assert sp == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)))
    flash = me.activation_bytes_per_layer(cfg, b, s, flash_attention=True, dropout=False)
    assert flash == pytest.approx(s * b * h * 32)


def test_llama2_7b_from_its_hugging_face_config() -> None:
    config = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    cfg = me.TransformerConfig.from_mapping(config)
    # Meta's published size: 6.74 B parameters (Llama 2 paper, Table 1 rounds it to 7B).
    assert cfg.parameter_count() / 1e9 == pytest.approx(6.74, abs=0.01)
    n = cfg.parameter_count()
    est = me.estimate_transformer(config, batch_size=1, seq_len=4096, precision="bf16")
    states = sum(est.breakdown[k] for k in ("parameters", "gradients", "optimizer_state"))
    assert states == pytest.approx(16 * n, rel=1e-6)
    assert est.peak_bytes == sum(est.breakdown.values()) == max(est.step_peaks.values())
    # At batch 1 the peak is Adam's update: the states plus one fp32 copy of the parameters
    # (foreach), 20 bytes per parameter, above the backward's 16 + 17 GB of activations.
    acts = 32 * me.activation_bytes_per_layer(cfg, 1, 4096, flash_attention=True, dropout=False)
    assert est.peak_phase == "optimizer step"
    assert est.breakdown["temporaries"] == pytest.approx(4 * n, rel=1e-6)
    assert est.breakdown["activations"] == 0
    logits = 2 * 4 * 4096 * 32000
    assert est.step_peaks["backward"] == pytest.approx(states + acts + logits, rel=1e-6)
    assert "at the optimizer step (backward" in repr(est)
    fsdp = me.estimate_transformer(config, seq_len=4096, parallelism="fsdp:8")
    assert fsdp.breakdown["optimizer_state"] == pytest.approx(12 * n / 8, rel=1e-6)
    assert fsdp.peak_phase == "backward"
    assert fsdp.breakdown["activations"] == pytest.approx(acts, rel=1e-6)  # FSDP keeps them all
    ckpt = me.estimate_transformer(config, seq_len=4096, checkpointing=True)
    assert ckpt.step_peaks["backward"] - states - logits < acts / 4
    gen = me.estimate_transformer(config, seq_len=4096, training=False, precision="fp16")
    assert gen.breakdown["kv_cache"] == 2 * 32 * 32 * 128 * 4096 * 2
    assert gen.breakdown["gradients"] == gen.breakdown["optimizer_state"] == 0
    # Batch 2 moves the backward above the update; the update is a floor no batch goes under.
    assert est.at_batch(2) == est.step_peaks["backward"] + est.per_sample_bytes > est.peak_bytes
    assert est.largest_batch(est.at_batch(3)) == 3
    assert est.largest_batch(est.peak_bytes - 1) == 0


LLAMA2_7B_AS_SAVED = {  # a config.json that leaves hidden_act and tie_word_embeddings out
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    ("config", "published_billions"),
    [
        # Llama 2 7B: 6.74 B (Meta's model card); its MLP is gated whatever the config omits,
        # and LlamaConfig does not tie the head to the embeddings.
        (LLAMA2_7B_AS_SAVED, 6.74),
        # Gemma 7B: 8.54 B (Gemma report, Table 2: 786 M embedding + 7,751 M other); GeGLU
        # MLP with hidden_act gelu_pytorch_tanh, tied embeddings.
        (
            {
                "model_type": "gemma",
                "hidden_act": "gelu_pytorch_tanh",
                "hidden_size": 3072,
                "intermediate_size": 24576,
                "num_attention_heads": 16,
                "num_hidden_layers": 28,
                "head_dim": 256,
                "vocab_size": 256000,
            },
            8.54,
        ),
        # Mixtral 8x7B: 46.7 B total (Mistral AI's announcement): eight SwiGLU experts a layer.
        (
            {
                "model_type": "mixtral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "num_hidden_layers": 32,
                "vocab_size": 32000,
                "num_local_experts": 8,
            },
            46.7,
        ),
    ],
)
def test_model_family_decides_the_mlp_and_the_head(
    config: dict[str, object], published_billions: float
) -> None:
    cfg = me.TransformerConfig.from_mapping(config)
    assert cfg.parameter_count() / 1e9 == pytest.approx(published_billions, abs=0.01)


def test_plain_mlp_families_and_unknown_moe_layouts() -> None:
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257}
    assert not me.TransformerConfig.from_mapping(gpt2).gated_mlp
    assert me.TransformerConfig.from_mapping(gpt2).tied_embeddings
    qwen_moe = {**LLAMA2_7B_AS_SAVED, "model_type": "qwen2_moe", "num_experts": 60}
    with pytest.raises(GpuDiagError, match="mixture-of-experts"):
        me.TransformerConfig.from_mapping(qwen_moe)


def test_tensor_parallelism_must_split_whole_heads() -> None:
    # gpudiag plan refuses such layouts; the estimate must not price one either.
    with pytest.raises(GpuDiagError, match="does not divide the 32 attention heads"):
        me.estimate_transformer(LLAMA2_7B_AS_SAVED, parallelism="tp:3")
    assert me.estimate_transformer(LLAMA2_7B_AS_SAVED, parallelism="tp:4").peak_bytes > 0


def test_parallelism_parsing_and_errors() -> None:
    p = me.Parallelism.parse("zero2:8, tp:2, pp:4, sp")
    assert (p.dp, p.zero, p.tp, p.pp, p.sequence_parallel, p.gpus) == (8, 2, 2, 4, True, 64)
    assert me.Parallelism.parse({"dp": 4}).describe() == "DDP x4"
    assert me.Parallelism.parse(None).gpus == 1
    for bad in ("mesh:2", "fsdp:x", {"ranks": 2}, 3.5):
        with pytest.raises(GpuDiagError):
            me.Parallelism.parse(bad)
    with pytest.raises(GpuDiagError):
        me.Parallelism(dp=0)
    with pytest.raises(GpuDiagError, match="precision"):
        me.bytes_per_parameter("int3")
    with pytest.raises(GpuDiagError, match="num_hidden_layers"):
        me.TransformerConfig.from_mapping({"hidden_size": 8})
    with pytest.raises(GpuDiagError):
        me.estimate_transformer({"n_layer": 2, "n_embd": 64, "n_head": 4}, batch_size=0)


def test_estimate_report_is_escaped_and_json_safe() -> None:
    import json

    est = me.estimate_transformer(
        {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}, name="<b>gpt</b>"
    )
    html = est._repr_html_()
    assert "<b>gpt</b>" not in html
    assert "&lt;b&gt;gpt&lt;/b&gt;" in html
    data = json.loads(json.dumps(est.to_dict()))
    assert data["peak_bytes"] == est.peak_bytes
    assert data["route"] == "formula"
    assert "peak" in repr(est)
    assert "activations" in repr(est)


SMALL = me.TransformerConfig(layers=2, hidden=384, heads=6, vocab_size=8192, seq_len=32)


def test_ddp_buckets_are_a_second_gradient_copy_unless_they_are_views() -> None:
    ddp = me.estimate_transformer(SMALL, precision="fp32", parallelism="ddp:2", seq_len=32)
    view = me.estimate_transformer(
        SMALL, precision="fp32", parallelism="ddp:2", seq_len=32, ddp_bucket_view=True
    )
    one = me.estimate_transformer(SMALL, precision="fp32", seq_len=32)
    grads = 4 * SMALL.parameter_count()
    assert ddp.breakdown["other"] == ddp.breakdown["gradients"] == grads
    assert view.breakdown["other"] == one.breakdown["other"] == 0
    assert ddp.peak_bytes - view.peak_bytes == grads
    assert any("gradient_as_bucket_view=True saves it" in a for a in ddp.assumptions)
    # ZeRO-1 shards the optimizer state and does not use DDP's buckets.
    zero1 = me.estimate_transformer(SMALL, precision="fp32", parallelism="zero1:2", seq_len=32)
    assert zero1.step_peaks["backward"] < ddp.step_peaks["backward"]


def test_fsdp_holds_the_root_unit_and_two_blocks_whole_in_the_backward() -> None:
    est = me.estimate_transformer(SMALL, precision="fp32", parallelism="fsdp:2", seq_len=32)
    root = 8192 * 384 + 384  # tied embedding / head and the final norm
    block = 12 * 384 * 384 + 2 * 384
    assert SMALL.outer_parameters() == root
    assert SMALL.layer_parameters() == block
    # The root's weights and gradients; the current block, the prefetched one and its gradients.
    assert est.breakdown["other"] == root * (4 + 4) + block * (2 * 4 + 4)
    tp2 = me.estimate_transformer(SMALL, precision="fp32", parallelism="fsdp:2,tp:2", seq_len=32)
    assert tp2.breakdown["other"] == pytest.approx(est.breakdown["other"] / 2, abs=1)
    assert est.peak_phase == "backward"


def test_adam_update_is_a_floor_that_sgd_does_not_have() -> None:
    n = SMALL.parameter_count()
    adam = me.estimate_transformer(SMALL, precision="fp32", seq_len=32, batch_size=1)
    sgd = me.estimate_transformer(SMALL, precision="fp32", seq_len=32, optimizer="sgd")
    assert adam.step_peaks["optimizer step"] == 5 * 4 * n  # params, grads, 2 moments, update
    assert sgd.step_peaks["optimizer step"] == 2 * 4 * n
    assert me.optimizer_update_bytes(n, me.Parallelism.parse("fsdp:4")) == 4 * n // 4
    assert me.optimizer_update_bytes(n, me.Parallelism.parse("ddp:4")) == 4 * n
    # A batch that shrinks the backward's peak never goes under the update's.
    assert adam.peak_phase == "optimizer step"
    assert adam.at_batch(1) == adam.peak_bytes
    assert adam.largest_batch(adam.step_peaks["optimizer step"] - 1) == 0
    big = adam.largest_batch(adam.step_peaks["optimizer step"] * 2)
    assert big > 1
    assert adam.at_batch(big) <= adam.step_peaks["optimizer step"] * 2
    assert adam.to_dict()["peak_phase"] == "optimizer step"
