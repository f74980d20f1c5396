"""Memory rules on real snapshots, real nvidia-smi recordings and real CPU steps."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag import workloads
from gpudiag.analysis.memory_estimate import estimate_transformer
from gpudiag.fixes import Fix
from gpudiag.probe.cuda_memory import AllocatorStats
from gpudiag.probe.system import inspect
from gpudiag.rules import Diagnosis, Finding
from gpudiag.rules.memory import memory_findings

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "memory-snapshots"
LLAMA2_7B = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def _ids(diagnosis: Diagnosis) -> dict[str, Finding]:
    return {f.id: f for f in diagnosis.findings}


def test_fragmentation_from_a_real_snapshot() -> None:
    fragmented = memory_findings(
        snapshot=gd.analyze_memory_snapshot(SNAPSHOTS / "decomfl-memory.pickle.gz")
    )
    finding = _ids(fragmented)["memory.fragmentation"]
    assert finding.fix is not None
    assert finding.fix.id == "allocator.config"
    assert finding.fix == Fix("allocator.config", expandable_segments=True)
    full = memory_findings(
        snapshot=gd.analyze_memory_snapshot(SNAPSHOTS / "flexgen-fork-opt-oom_snapshot.pickle")
    )
    assert "memory.fragmentation" not in _ids(full)  # 11.03 of 11.03 GiB in live tensors


def test_other_processes_on_a_recorded_gpu(fixtures_dir: Path) -> None:
    a10g = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "a10g.xml")
    finding = _ids(memory_findings(system=a10g))["memory.other_process"]
    assert "pid 725 Xorg (22.00 MiB)" in finding.message  # as the recording lists it
    p4 = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "tesla_p4.xml")
    finding = _ids(memory_findings(system=p4))["memory.other_process"]
    assert finding.message.startswith("13 other process(es)")
    assert "N/A" in finding.message


def test_out_of_memory_under_a_cap_is_a_high_finding() -> None:
    wl = workloads.get("gpt", seq_len=256, batch_size=4, d_model=64)
    report = gd.memory(wl, budget="8MiB", estimate=False)
    finding = _ids(memory_findings(report=report))["memory.out_of_memory"]
    assert finding.severity.value == "high"
    assert "activations" in finding.message
    assert any(e.name == "asked" for e in finding.evidence)


def test_formula_estimates_over_budget_headroom_and_kv_cache() -> None:
    train = estimate_transformer(LLAMA2_7B, seq_len=4096, precision="bf16")
    over = _ids(memory_findings(estimate=train, budget_bytes=80 * 10**9))
    assert "memory.over_budget" in over  # 16 bytes x 6.7 B parameters > 80 GB
    small = estimate_transformer({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100})
    room = _ids(memory_findings(estimate=small, budget_bytes=8 * 2**30))["memory.budget_headroom"]
    assert room.fix is not None
    assert room.fix.params["micro_batch"] > 1
    gen = estimate_transformer(
        LLAMA2_7B, batch_size=16, seq_len=4096, precision="fp16", training=False
    )
    kv = _ids(memory_findings(estimate=gen))["memory.kv_cache_dominates"]
    assert "KV cache" in kv.message


def test_checkpointing_that_cannot_help_on_a_wide_model() -> None:
    # Wide repeated blocks at a small batch: the peak is the Adam step (weights, gradients,
    # moments), not stored activations, so checkpointing the blocks saves almost nothing.
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(512, 512)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.fc(x))

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x.square().mean()

    wl = gd.Workload(
        Wide(), batch=lambda bs: torch.randn(bs, 512), optimizer=torch.optim.Adam, batch_size=2
    )
    fit = gd.fit(wl, memory_budget="1GiB", confirm=False)
    found = _ids(memory_findings(fit=fit))
    assert "memory.checkpointing_cannot_help" in found
    gpt_fit = gd.fit(workloads.get("gpt", seq_len=128, d_model=64), "1GiB", confirm=False)
    assert "memory.checkpointing_cannot_help" not in _ids(memory_findings(fit=gpt_fit))


def test_reserved_but_unused_from_allocator_counters() -> None:
    """torch.cuda.memory_stats values as a GPU would report them (faked: no GPU here)."""
    stats = AllocatorStats(
        10 * 2**30, 30 * 2**30, 25 * 2**30, 30 * 2**30, 10 * 2**30, 15 * 2**30, 4, 0
    )
    finding = _ids(memory_findings(allocator=stats))["memory.reserved_unused"]
    assert "retried 4 times" in finding.message
    skipped = {n.rule for n in memory_findings().not_evaluated}
    assert {"memory.fragmentation", "memory.reserved_unused"} <= skipped


@pytest.mark.parametrize("rule_id", ["memory.over_budget", "memory.budget_headroom"])
def test_rules_without_a_budget_are_not_evaluated(rule_id: str) -> None:
    small = estimate_transformer({"n_layer": 2, "n_embd": 64, "n_head": 4})
    assert rule_id in {n.rule for n in memory_findings(estimate=small).not_evaluated}


def test_a_peak_at_the_optimizer_step_names_fused_adam_and_what_it_saves() -> None:
    # Llama 2 7B at batch 1 on one GPU: Adam's foreach copy (4 bytes x 6.74 B) lifts the
    # optimizer step above the backward.
    train = estimate_transformer(LLAMA2_7B, seq_len=4096, precision="bf16")
    assert train.peak_phase == "optimizer step"
    finding = _ids(memory_findings(estimate=train))["memory.optimizer_step_peak"]
    assert "fused=True" in finding.instruction
    assert "AdamW" in finding.instruction
    values = {e.name: e.value for e in finding.evidence}
    assert values["of it, the update's copy"] == round(train.breakdown["temporaries"] / 2**20, 1)
    assert values["peak with fused=True (about)"] == round(train.step_peaks["backward"] / 2**20, 1)
    # Sharded over 8 ranks the update shrinks 8x and the backward is the peak: no finding.
    fsdp = estimate_transformer(LLAMA2_7B, seq_len=4096, precision="bf16", parallelism="fsdp:8")
    assert "memory.optimizer_step_peak" not in _ids(memory_findings(estimate=fsdp))
    sgd = estimate_transformer(LLAMA2_7B, seq_len=4096, precision="bf16", optimizer="sgd")
    assert "memory.optimizer_step_peak" not in _ids(memory_findings(estimate=sgd))
