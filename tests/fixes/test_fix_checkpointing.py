"""activation.checkpointing: which blocks it finds, same numbers with less memory, full revert."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from gpudiag.errors import UnsupportedFixError
from gpudiag.experiment.compare import compare
from gpudiag.fixes import Fix, apply_fixes
from gpudiag.fixes.checkpointing import CheckpointedForward
from gpudiag.probe.system import inspect
from gpudiag.recipe import Recipe
from gpudiag.workloads import get
from gpudiag.workloads.gpt import Block, CausalSelfAttention, TinyGPT

SMALL_GPT = {"seq_len": 32, "d_model": 32, "n_head": 2, "vocab_size": 64, "batch_size": 2}


def gpt(n_layer: int = 4, dropout: float = 0.0) -> tuple[TinyGPT, dict[str, torch.Tensor]]:
    wl = get("gpt", n_layer=n_layer, dropout=dropout, **SMALL_GPT)
    return wl.model, wl.make_batch()


def wrapped(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(vars(m).get("forward"), CheckpointedForward)]


def own_forwards(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in vars(m)]


def loss_and_grads(
    model: nn.Module, run: Callable[[nn.Module], torch.Tensor], seed: int = 1
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = run(model)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same(
    a: tuple[torch.Tensor, dict[str, torch.Tensor]], b: tuple[torch.Tensor, dict[str, torch.Tensor]]
) -> None:
    assert torch.allclose(a[0], b[0], rtol=1e-6, atol=0)
    assert a[1].keys() == b[1].keys()
    assert a[1]
    for name in a[1]:
        assert torch.allclose(a[1][name], b[1][name], rtol=1e-5, atol=1e-7), name


def gpt_loss(batch: dict[str, torch.Tensor]) -> Callable[[nn.Module], torch.Tensor]:
    return lambda model: model(**batch).loss


@pytest.fixture
def checkpoint_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of torch.utils.checkpoint.checkpoint (still running the real one)."""
    calls: list[int] = []
    real = torch.utils.checkpoint.checkpoint

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    return calls


# -- which blocks ------------------------------------------------------------------------------


class Expert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


class MoELayer(nn.Module):
    """A layer whose list of experts holds more modules than the model's list of layers."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.experts = nn.ModuleList(Expert(width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + sum(e(h) for e in self.experts) / len(self.experts)


class MoE(nn.Module):
    def __init__(self, width: int = 8, layers: int = 2, experts: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MoELayer(width, experts) for _ in range(layers))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn(self.conv(x)))


class TinyResNet(nn.Module):
    """Stages of different lengths, each an nn.Sequential of ResBlocks, as in torchvision."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.stage1 = nn.Sequential(ResBlock(channels), ResBlock(channels))
        self.stage2 = nn.Sequential(ResBlock(channels), ResBlock(channels), ResBlock(channels))
        self.head = nn.Linear(channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.stage1(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def test_auto_detection_finds_the_gpt_block_list() -> None:
    model, _ = gpt(n_layer=4)
    with Fix("activation.checkpointing").applied(model, check=False) as applied:
        assert wrapped(model) == list(model.blocks)
        assert own_forwards(model) == [f"blocks.{i}" for i in range(4)]
        assert applied.notes == ["activation.checkpointing: 4 of 4 blocks checkpointed (4 Block)"]
    assert own_forwards(model) == []


def test_auto_detection_prefers_the_outer_layers_over_nested_lists() -> None:
    model = MoE(layers=2, experts=6)  # 12 experts in lists of 6, 2 layers in a list of 2
    with Fix("activation.checkpointing").applied(model, check=False):
        assert wrapped(model) == list(model.layers)


def test_auto_detection_takes_the_blocks_of_every_stage() -> None:
    model = TinyResNet()
    with Fix("activation.checkpointing").applied(model, check=False) as applied:
        assert wrapped(model) == [*model.stage1, *model.stage2]
        assert "5 of 5 blocks checkpointed (5 ResBlock)" in applied.notes[0]


@pytest.mark.parametrize(
    "classes",
    [
        ("CausalSelfAttention",),
        ("gpudiag.workloads.gpt.CausalSelfAttention",),
        "CausalSelfAttention",
    ],
)
def test_classes_picks_those_submodules(classes: Any) -> None:
    model, _ = gpt(n_layer=3)
    with Fix("activation.checkpointing", classes=classes).applied(model, check=False):
        found = wrapped(model)
        assert found == [b.attn for b in model.blocks]
        assert all(isinstance(m, CausalSelfAttention) for m in found)


def test_classes_inside_classes_are_covered_by_the_outer_one() -> None:
    model, _ = gpt(n_layer=2)
    fix = Fix.parse("activation.checkpointing:classes=Block+CausalSelfAttention")
    with fix.applied(model, check=False):
        assert wrapped(model) == list(model.blocks)


def test_every_second_layer_wraps_half(checkpoint_calls: list[int]) -> None:
    model, batch = gpt(n_layer=4)
    with Fix.parse("activation.checkpointing=2").applied(model, check=False) as applied:
        assert wrapped(model) == [model.blocks[0], model.blocks[2]]
        assert "2 of 4 blocks" in applied.notes[0]
        model(**batch).loss.backward()
    assert len(checkpoint_calls) == 2


# -- same numbers ------------------------------------------------------------------------------


def test_gpt_loss_and_gradients_match_with_dropout_on(checkpoint_calls: list[int]) -> None:
    model, batch = gpt(n_layer=3, dropout=0.2)
    reference = copy.deepcopy(model)
    with Fix("activation.checkpointing").applied(model, check=False):
        checkpointed = loss_and_grads(model, gpt_loss(batch))
    assert len(checkpoint_calls) == 3
    # the RNG state is restored for the recomputation: the same dropout masks
    assert_same(checkpointed, loss_and_grads(reference, gpt_loss(batch)))
    # a different seed draws other masks: the comparison above can tell them apart
    assert not torch.allclose(
        loss_and_grads(reference, gpt_loss(batch), seed=2)[0], checkpointed[0]
    )


def test_custom_model_with_keyword_arguments_matches() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.debug_seen: list[bool] = []

        def forward(self, x: torch.Tensor, *, scale: torch.Tensor, debug: bool = False) -> Any:
            self.debug_seen.append(debug)
            return torch.tanh(self.lin(x)) * scale

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stack = nn.ModuleList(Scaled() for _ in range(3))

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            for layer in self.stack:
                # "debug" is also one of checkpoint's own keyword arguments
                x = layer(x, scale=scale, debug=True)
            return x.pow(2).mean()

    model = Net()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 6)

    def run(m: nn.Module) -> torch.Tensor:
        return m(x, torch.full((6,), 0.5, requires_grad=True))

    with Fix("activation.checkpointing").applied(model, check=False):
        assert wrapped(model) == list(model.stack)
        assert_same(loss_and_grads(model, run), loss_and_grads(reference, run))
    # forward and recomputation both got the block's own "debug", not checkpoint's
    assert [layer.debug_seen for layer in model.stack] == [[True, True]] * 3


def test_batchnorm_running_statistics_are_updated_once() -> None:
    model = TinyResNet()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8)
    with Fix("activation.checkpointing").applied(model, check=False):
        assert_same(
            loss_and_grads(model, lambda m: m(x).sum()),
            loss_and_grads(reference, lambda m: m(x).sum()),
        )
    for (name, ours), (_, theirs) in zip(
        model.named_buffers(), reference.named_buffers(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    assert int(model.stage1[0].bn.num_batches_tracked) == 1


def test_eval_and_no_grad_run_plainly(checkpoint_calls: list[int]) -> None:
    model, batch = gpt(n_layer=2)
    with Fix("activation.checkpointing").applied(model, check=False):
        model.eval()
        loss = model(**batch).loss
        model.train()
        with torch.no_grad():
            model(**batch)
        assert checkpoint_calls == []
        assert loss.requires_grad  # eval with gradients: a plain forward, still differentiable
        model(**batch)
        assert len(checkpoint_calls) == 2


def test_bf16_autocast_and_checkpointing_give_bf16_alone(bf16_cpu: Any) -> None:
    model, batch = gpt(n_layer=2)
    reference = copy.deepcopy(model)
    fixes = [Fix("activation.checkpointing"), Fix("precision.bf16")]
    with apply_fixes(fixes, model, system=bf16_cpu):
        both = loss_and_grads(model, gpt_loss(batch))
    with Fix("precision.bf16").applied(reference, system=bf16_cpu):
        bf16 = loss_and_grads(reference, gpt_loss(batch))
    assert both[0].dtype == torch.float32
    assert_same(both, bf16)
    assert own_forwards(model) == []


@pytest.mark.slow
def test_compile_wraps_the_checkpointed_model(bf16_cpu: Any) -> None:
    model, batch = gpt(n_layer=2)
    reference = copy.deepcopy(model)
    fixes = [Fix("compile"), Fix("activation.checkpointing")]
    with apply_fixes(fixes, model, system=bf16_cpu) as applied:
        compiled = applied.model
        assert compiled is not model
        assert wrapped(model) == list(model.blocks)
        ours = loss_and_grads(model, lambda _: compiled(**batch).loss)
    theirs = loss_and_grads(reference, gpt_loss(batch))
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5)
    for name, grad in theirs[1].items():
        assert torch.allclose(ours[1][name], grad, rtol=1e-4, atol=1e-6), name
    assert own_forwards(model) == []


@pytest.mark.slow
def test_compile_keeps_batchnorm_statistics_updated_once(bf16_cpu: Any) -> None:
    model = TinyResNet()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8)
    fixes = [Fix("compile"), Fix("activation.checkpointing")]
    with apply_fixes(fixes, model, system=bf16_cpu) as applied:
        compiled = applied.model
        ours = loss_and_grads(model, lambda _: compiled(x).sum())
    theirs = loss_and_grads(reference, lambda m: m(x).sum())
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5)
    for (name, buf), (_, ref) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.allclose(buf.float(), ref.float(), rtol=1e-5, atol=1e-6), name


# -- revert and copies -------------------------------------------------------------------------


def test_revert_restores_a_forward_the_instance_already_had() -> None:
    model, batch = gpt(n_layer=2)
    first = model.blocks[0]
    seen: list[int] = []

    def hooked(x: torch.Tensor) -> torch.Tensor:
        seen.append(1)
        return Block.forward(first, x)

    first.forward = hooked  # type: ignore[method-assign]
    with Fix("activation.checkpointing").applied(model, check=False):
        model(**batch).loss.backward()
        assert isinstance(vars(first)["forward"], CheckpointedForward)
    assert len(seen) == 2  # the forward pass and its recomputation went through it
    assert vars(first)["forward"] is hooked
    assert own_forwards(model) == ["blocks.0"]
    assert type(first).forward is Block.forward


def test_a_copy_of_the_applied_model_checkpoints_its_own_blocks() -> None:
    model, batch = gpt(n_layer=2)
    with Fix("activation.checkpointing").applied(model, check=False):
        clone = copy.deepcopy(model)
    assert own_forwards(model) == []
    assert wrapped(clone) == list(clone.blocks)
    clone(**batch).loss.backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in clone.parameters())


# -- refusals ----------------------------------------------------------------------------------


def test_nothing_to_wrap_says_to_name_the_classes() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(UnsupportedFixError, match=r"no repeated blocks in Sequential.*classes="):
        Fix("activation.checkpointing").apply(model, check=False)
    assert own_forwards(model) == []


def test_unknown_class_lists_the_repeated_ones() -> None:
    model, _ = gpt(n_layer=2)
    with pytest.raises(UnsupportedFixError, match=r"class Blok.*Block \(2\)"):
        Fix("activation.checkpointing", classes=("Blok",)).apply(model, check=False)


def test_needs_a_module() -> None:
    with pytest.raises(UnsupportedFixError, match=r"torch\.nn\.Module"):
        Fix("activation.checkpointing").apply(None, check=False)


# -- the fix's facts ---------------------------------------------------------------------------


def test_supported_on_cpus_and_gpus_and_applied_by_a_recipe(
    make_cpu_system: Any, fixtures_dir: Path
) -> None:
    fix = Fix("activation.checkpointing")
    a100 = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "a100-sxm4-v12.xml")
    assert fix.implemented
    assert fix.tryable(make_cpu_system()) == (True, "")
    assert fix.tryable(a100) == (True, "")
    model, _ = gpt(n_layer=2)
    applied = Recipe.of(["activation.checkpointing=2"]).apply(model, system=make_cpu_system())
    try:
        assert [f.id for f in applied.fixes] == ["activation.checkpointing"]
        assert applied.skipped == []
        assert wrapped(model) == [model.blocks[0]]
    finally:
        applied.revert()
    assert own_forwards(model) == []


def test_code_lines_checkpoint_like_the_fix() -> None:
    model, batch = gpt(n_layer=4)
    reference = copy.deepcopy(model)
    lines = Fix("activation.checkpointing", classes=("Block",), every_n_layers=2).code()
    exec("\n".join(lines), {"model": model})
    assert own_forwards(model) == ["blocks.0", "blocks.2"]
    assert_same(loss_and_grads(model, gpt_loss(batch)), loss_and_grads(reference, gpt_loss(batch)))


def test_compare_measures_less_memory_and_no_drift() -> None:
    wl = get("gpt", n_layer=4, **{**SMALL_GPT, "seq_len": 64, "batch_size": 4})
    c = compare(
        wl,
        fixes=["activation.checkpointing"],
        adaptive=False,
        min_rounds=2,
        max_rounds=2,
        warmup_steps=1,
        progress=False,
    )
    (arm,) = c.arms
    assert arm.error is None
    assert c.baseline.memory is not None
    assert arm.memory is not None
    assert c.baseline.memory.peak_bytes
    assert arm.memory.peak_bytes
    assert arm.memory.peak_bytes < 0.8 * c.baseline.memory.peak_bytes
    assert arm.drift is not None
    assert arm.drift.status == "ok"
    assert arm.drift.loss_rel is not None
    assert arm.drift.loss_rel < 1e-5
    assert any("4 of 4 blocks checkpointed" in n for n in arm.notes)
    assert own_forwards(wl.model) == []
    # A memory fix is kept for the memory it saves, whatever the speed verdict.
    assert c.memory_saving(arm) > 0.2
    assert c.kept() == [arm]
    assert [f.id for f in c.recipe().fixes] == ["activation.checkpointing"]
