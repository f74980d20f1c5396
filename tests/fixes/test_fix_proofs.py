"""Proof of effect, per fix id: each fix shows from the arm's own step that it took effect, and
says "not applied" (with the reason and the change to make by hand) where it cannot reach
the model. Runs for real on the CPU; the CUDA-only fixes are checked on what their proofs
read (switches, counters, modules), with the fakes the fix tests use."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpudiag as gd
from gpudiag.experiment.runner import Arm
from gpudiag.fixes import Fix, Observation, Proof, ProofStatus
from gpudiag.fixes.fsdp import fsdp_proof
from gpudiag.profiling.census import op_census
from gpudiag.step import Step
from tests.fixes.test_fix_cuda_graphs import FakeGraphs, graphed, net


# -- a model a newcomer writes: attention by hand --------------------------------------------
class HandAttention(nn.Module):
    """Causal self-attention written out: softmax(q @ k.transpose(-2, -1) * scale) @ v."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, d))


class SdpaAttention(HandAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Blocks(nn.Module):
    def __init__(self, block: type[nn.Module] = HandAttention, frozen: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block(), block()])
        self.frozen = frozen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.frozen:  # a frozen feature extractor: no gradients through its blocks
                with torch.no_grad():
                    x = x + layer(x)
            else:
                x = x + layer(x)
        return x


def workload(model: nn.Module, batch: Any = None, batch_size: int = 4) -> gd.Workload:
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)
    return gd.Workload(
        model,
        batch=batch if batch is not None else x,
        loss=lambda m, b: m(b).square().mean(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        batch_size=batch_size,
    )


def prove(wl: gd.Workload, *fixes: Fix | str) -> tuple[Proof, ...]:
    """The proofs of ``fixes`` from one observed step of their arm (and of the baseline)."""
    arms = [
        Arm(label, tuple(Fix.coerce(f) for f in combo), wl, copy.deepcopy(wl.model), False, "cpu")
        for label, combo in (("baseline", ()), ("arm", fixes))
    ]
    try:
        for arm in arms:
            arm.open()
            arm.new_optimizer()
        baseline = arms[0].prove(None)
        arms[1].prove(baseline)
        return arms[1].proofs
    finally:
        for arm in arms:
            arm.close()


def one(proofs: tuple[Proof, ...]) -> Proof:
    (proof,) = proofs
    return proof


QUICK: dict[str, Any] = {
    "progress": False,
    "max_rounds": 4,
    "min_rounds": 3,
    "warmup_steps": 1,
    "drift_steps": 1,
    "min_sample_s": 0.0,
    "measure_memory": False,
}


# -- attention.backend ------------------------------------------------------------------------
def test_the_census_tells_fused_attention_from_softmax_between_matmuls() -> None:
    x = torch.randn(2, 8, 16, requires_grad=True)
    hand, _ = op_census(lambda: HandAttention()(x).sum().backward())
    fused, _ = op_census(lambda: SdpaAttention()(x).sum().backward())
    assert (hand.softmax_attention, hand.fused_attention_calls) == (1, 0)
    assert (fused.softmax_attention, dict(fused.fused_attention)) == (0, {"flash": 1})
    assert hand.gemm_dtypes["float32"] > 0


def test_attention_backend_on_hand_written_attention_is_not_applied(bf16_cpu: Any) -> None:
    wl = workload(Blocks(HandAttention))
    c = gd.compare(wl, ["attention.backend=flash"], system=bf16_cpu, **QUICK)
    arm = c.arm("attention.backend=flash")
    assert arm.verdict == "not applied"
    assert arm.step_time.n == 0  # never timed
    assert arm.speedup is None
    (proof,) = arm.proofs
    assert proof.status is ProofStatus.NOT_APPLIED
    assert proof.reason.startswith(
        "the model computes attention by hand (softmax between matmuls, 2 per step)"
    )
    assert "it has no attention-implementation switch" in proof.reason
    assert "torch.nn.functional.scaled_dot_product_attention(q, k, v" in proof.manual
    assert 'attn_implementation="sdpa"' in proof.manual
    assert proof.evidence == "arm: 2 softmax between matmuls; baseline: 2 softmax between matmuls"
    assert "attention.backend=flash: not applied: the model computes attention by hand" in repr(c)
    assert c.kept() == []
    assert c.recipe().fixes == []


def test_attention_backend_on_sdpa_already_fused_changes_nothing(bf16_cpu: Any) -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "attention.backend=flash"))
    assert proof.not_applied
    assert "the baseline already runs the same fused attention (2 fused (flash))" in proof.reason


def test_attention_backend_math_on_sdpa_is_applied() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "attention.backend=math"))
    assert proof.applied
    assert proof.evidence == "arm: 2 softmax between matmuls; baseline: 2 fused (flash)"


def test_attention_code_does_not_pretend_to_change_hand_written_attention() -> None:
    code = "\n".join(Fix("attention.backend", backend="flash").code())
    assert "Attention written by hand" in code
    assert "softmax(q @ k.transpose(-2, -1) * scale) @ v, stays as it is" in code
    compile(code, "<attention>", "exec")


# -- precision.bf16 / fp16 --------------------------------------------------------------------
def test_bf16_proof_counts_the_arms_gemms_in_bfloat16() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "precision.bf16"))
    assert proof.applied
    # forward and backward GEMMs of the two blocks (attention is SDPA's own kernel)
    assert proof.evidence == "11 of 11 matrix products in bfloat16 (baseline: 11 float32)"


@pytest.mark.parametrize(
    ("fix", "dtype"), [("precision.bf16", "bfloat16"), ("precision.fp16", "float16")]
)
def test_autocast_is_not_applied_where_it_cannot_reach_the_matmuls(fix: str, dtype: str) -> None:
    class OutsideAutocast(nn.Module):  # the model turns autocast off around its own math
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", enabled=False):
                return self.fc(x.float())

    proof = one(prove(workload(OutsideAutocast()), fix))
    assert proof.not_applied
    assert proof.reason == (
        f"none of the step's 2 matrix products ran in {dtype} (2 float32): autocast did not "
        "reach them"
    )
    assert f"torch.autocast(device_type, dtype=torch.{dtype})" in proof.manual


def test_bf16_on_a_model_already_in_bf16_changes_nothing() -> None:
    model = Blocks(SdpaAttention).to(torch.bfloat16)
    wl = workload(model, batch=torch.randn(4, 8, 16, dtype=torch.bfloat16))
    proof = one(prove(wl, "precision.bf16"))
    assert proof.not_applied
    assert proof.reason.startswith("the baseline's matrix products already run in bfloat16")


def test_fp16_needs_its_gemms_in_float16_and_its_scaler() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "precision.fp16"))
    assert proof.applied
    assert proof.evidence.endswith("; loss scaled by a GradScaler")


# -- batch.size -------------------------------------------------------------------------------
def test_batch_size_proof_reads_the_micro_batches_the_step_ran() -> None:
    wl = workload(Blocks(SdpaAttention), batch=lambda n: torch.randn(n, 8, 16), batch_size=8)
    proof = one(prove(wl, "batch.size:micro_batch=4,accumulation=2"))
    assert proof.applied
    assert proof.evidence == (
        "2 micro-batch(es) of 4 sample(s) per optimizer step (asked 4 x 2; baseline: "
        "1 micro-batch(es) of 8 sample(s) per optimizer step)"
    )


def test_batch_size_is_not_applied_when_the_batch_function_ignores_the_size() -> None:
    fixed = torch.randn(8, 8, 16)
    wl = workload(Blocks(SdpaAttention), batch=lambda n: fixed, batch_size=8)
    proof = one(prove(wl, "batch.size=4"))
    assert proof.not_applied
    assert proof.reason == (
        "the arm ran 1 micro-batch(es) of 8 sample(s) per optimizer step, not what was asked "
        "(asked 4 x 1)"
    )


def test_batch_size_of_the_baseline_batch_is_not_applied() -> None:
    wl = workload(Blocks(SdpaAttention), batch=lambda n: torch.randn(n, 8, 16), batch_size=8)
    proof = one(prove(wl, "batch.size=8"))
    assert proof.not_applied
    assert "is the baseline's own batch: nothing changes" in proof.reason


def test_batch_size_without_a_size_is_refused_by_compare(bf16_cpu: Any) -> None:
    with pytest.raises(gd.GpuDiagError, match=r"batch\.size needs a size: give batch\.size=N"):
        gd.compare(workload(Blocks(SdpaAttention)), ["batch.size"], system=bf16_cpu, **QUICK)


# -- activation.checkpointing -----------------------------------------------------------------
def test_checkpointing_proof_counts_recomputation_in_the_backward() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "activation.checkpointing"))
    assert proof.applied
    assert proof.evidence.startswith("2 block forward(s) recomputed in the backward")


def test_checkpointing_of_blocks_run_without_gradients_is_not_applied() -> None:
    model = Blocks(SdpaAttention, frozen=True)
    model.head = nn.Linear(16, 16)  # something trains, so the step runs
    wl = gd.Workload(
        model,
        batch=torch.randn(4, 8, 16),
        loss=lambda m, b: m.head(m(b)).square().mean(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        batch_size=4,
    )
    proof = one(prove(wl, "activation.checkpointing"))
    assert proof.not_applied
    assert proof.reason.startswith("no checkpointed block was recomputed in the backward")


# -- compile ----------------------------------------------------------------------------------
def test_compile_of_a_forward_dynamo_skips_is_not_applied() -> None:
    class Skipped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        @torch.compiler.disable
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    proof = one(prove(workload(Skipped()), "compile"))
    assert proof.not_applied
    assert proof.reason.startswith(
        "no compiled code ran in the arm's step (1 compiled region(s) entered, 0 compiled graph "
        "call(s)"
    )


# -- dataloader.tuning ------------------------------------------------------------------------
def _loader_workload() -> gd.Workload:
    data = TensorDataset(torch.randn(32, 8, 16))
    return gd.Workload(
        Blocks(SdpaAttention),
        dataloader=DataLoader(data, batch_size=4),
        loss=lambda m, b: m(b[0]).square().mean(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
    )


@pytest.mark.slow
def test_dataloader_tuning_proof_counts_live_workers() -> None:
    proof = one(prove(_loader_workload(), "dataloader.tuning:num_workers=1"))
    assert proof.applied
    assert proof.evidence.startswith("1 DataLoader worker processes alive (num_workers=1")


@pytest.mark.slow
def test_dataloader_tuning_with_a_batch_fix_counts_the_workers_of_the_loader_it_iterates() -> None:
    # batch.size makes the step iterate a loader rebuilt at the new batch size: the workers
    # to count are that loader's (reading the tuned loader, never iterated, said unverified)
    proofs = prove(_loader_workload(), "dataloader.tuning:num_workers=1", "batch.size=8")
    loader_proof = next(p for p in proofs if p.fix.startswith("dataloader.tuning"))
    assert loader_proof.applied, loader_proof
    assert loader_proof.evidence.startswith("1 DataLoader worker processes alive (num_workers=1")


@pytest.mark.slow
def test_dataloader_tuning_with_dead_workers_is_not_applied() -> None:
    wl = _loader_workload()
    loader = DataLoader(wl.dataloader.dataset, batch_size=4, num_workers=1, persistent_workers=True)
    next(iter(loader))
    for worker in loader._iterator._workers:  # type: ignore[union-attr]
        worker.terminate()
        worker.join()
    step = Step.of(wl)
    step.dataloader, step.state["dataloader.tuning"] = loader, 1
    proof = Fix("dataloader.tuning", num_workers=1).proof(Observation(step=step))
    assert proof.not_applied
    assert proof.reason.startswith("0 of 1 DataLoader worker processes alive")
    del loader


# -- cuda.graphs (fake capture, as in its own tests) ------------------------------------------
@pytest.fixture
def fake_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGraphs]:
    from gpudiag.probe import cuda

    fake = FakeGraphs()
    monkeypatch.setattr(cuda, "make_graphed_callables", fake)
    return fake


def test_cuda_graphs_proof_counts_replays(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    with ExitStack() as stack:
        step = graphed(model, stack)
        model(x).sum().backward()
        model(x).sum().backward()
        proof = Fix("cuda.graphs").proof(Observation(step=step))
    assert proof.applied
    assert proof.evidence == "2 CUDA graph replay(s), 0 eager call(s) over the arm's steps so far"


def test_cuda_graphs_whose_calls_all_run_eagerly_is_not_applied(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    with ExitStack() as stack:
        step = graphed(model, stack)
        model(x, scale=2.0).sum().backward()  # keyword arguments: cannot replay
        proof = Fix("cuda.graphs").proof(Observation(step=step))
    assert proof.not_applied
    assert proof.reason.startswith("the captured graphs never replayed (cuda.graphs: Net.forward")


# -- fsdp.wrap --------------------------------------------------------------------------------
def test_fsdp_proof_sees_the_wrapper_and_its_shards(one_rank_group: None) -> None:
    from gpudiag.fixes.fsdp import shard_blocks

    model = Blocks(SdpaAttention)
    plain = fsdp_proof("fsdp.wrap", copy.deepcopy(model))
    assert plain.not_applied
    assert plain.reason == (
        "0 FSDP module(s), 0 of 8 parameter(s) sharded: fully_shard did not reach the model"
    )
    shard_blocks(model, {})
    proof = fsdp_proof("fsdp.wrap", model)
    assert proof.applied
    assert proof.evidence == (
        "3 module(s) wrapped by fully_shard; 8 of 8 parameter(s) sharded (DTensor) over 1 rank(s)"
    )


# -- environment fixes: the setting read back in the process ----------------------------------
@pytest.mark.parametrize(
    ("fix", "variable", "value"),
    [
        ("allocator.config", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("nccl.env:NCCL_ALGO=Ring", "NCCL_ALGO", "Ring"),
    ],
)
def test_environment_fixes_are_read_back(fix: str, variable: str, value: str) -> None:
    step = Step()
    missing = Fix.parse(fix).proof(Observation(step=step, environ={}))
    assert missing.not_applied
    assert missing.reason == (
        f"{variable} is not set in the process: environment variables are read when it starts"
    )
    assert missing.manual.startswith(f"export {variable}=")
    there = Fix.parse(fix).proof(Observation(step=step, environ={variable: value}))
    assert there.applied


# -- ambient switches: read back inside the arm, and something they govern ran ----------------
def test_cudnn_benchmark_on_a_step_without_convolutions_is_not_applied() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "cudnn.benchmark"))
    assert proof.not_applied
    assert proof.reason == "the step ran no convolution: cudnn.benchmark governs nothing here"


def test_tf32_switch_is_read_back_inside_the_arm() -> None:
    proof = one(prove(workload(Blocks(SdpaAttention)), "precision.tf32"))
    assert proof.applied  # on a CPU the flag governs nothing; the trial skips it (supported())
    assert proof.evidence.startswith("allow_tf32 read back True inside the arm; 11 float32")
    off = Fix("precision.tf32").proof(Observation(step=Step(), switches={}))
    assert off.not_applied


def test_fp8_proof_is_module_inspection() -> None:
    proof = Fix("precision.fp8").proof(Observation(step=Step()))
    assert proof.not_applied
    assert proof.reason == "no Linear layer of the arm's model was converted"


def test_every_live_fix_declares_its_proof() -> None:
    from gpudiag.fixes import FixKind, FixSpec, registry

    for fix_id, spec in registry().items():
        if spec.kind in (FixKind.ADVICE,):
            continue
        assert type(spec).proof is not FixSpec.proof, f"{fix_id} declares no proof of effect"


def test_attention_backend_on_multihead_attention_weights_names_need_weights() -> None:
    class Mha(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x)[0]  # need_weights=True, the default

    proof = one(prove(workload(Mha()), "attention.backend=sdpa"))
    assert proof.not_applied
    assert proof.reason.startswith(
        "torch.nn.MultiheadAttention computes it as (softmax between matmuls, 1 per step)"
    )
    assert proof.manual.startswith("call torch.nn.MultiheadAttention with need_weights=False")


def test_a_fix_that_refuses_the_model_is_not_applied_not_an_error(bf16_cpu: Any) -> None:
    # No repeated blocks to checkpoint: the arm is "not applied" with the fix's own reason,
    # the other arms run (the comparison used to fail as a whole).
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    c = gd.compare(
        workload(model), ["activation.checkpointing", "precision.bf16"], system=bf16_cpu, **QUICK
    )
    arm = c.arm("activation.checkpointing")
    assert (arm.verdict, arm.error, arm.step_time.n) == ("not applied", None, 0)
    assert arm.not_applied_reason.startswith(
        "activation.checkpointing found no repeated blocks in Sequential"
    )
    assert str(arm.drift) == "not measured (the fix did not take effect: the arm was not run)"
    assert c.arm("precision.bf16").step_time.n > 0
