"""precision.fp8 against an import-level fake of Transformer Engine on a hand-built H100.

The fake keeps the documented names and signatures (``te.Linear(in, out, bias=, params_dtype=,
device=)``, ``te.autocast(recipe=)`` / ``te.fp8_autocast(fp8_recipe=)``, ``DelayedScaling``,
``Format``) so a wrong keyword fails here; it computes like ``nn.Linear`` and records where it
ran. The real Transformer Engine is not exercised.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gpudiag.errors import UnsupportedFixError
from gpudiag.experiment.runner import Arm
from gpudiag.fixes import Fix, Step, get_spec
from gpudiag.fixes.precision import fp8_linear_plan
from gpudiag.probe.model import Gpu, GpuInfo, GpuState
from gpudiag.probe.readings import ok
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.step import Workload
from tests.fakes.machines import cpu_system


def h100() -> SystemReport:
    """A machine with one H100 (compute capability 9.0) visible to CUDA."""
    info = GpuInfo(
        index=0,
        name=ok("NVIDIA H100 80GB HBM3"),
        compute_capability=ok((9, 0)),
        cuda_index=0,
    )
    return dataclasses.replace(cpu_system(), gpus=(Gpu(info, GpuState()),), gpu_count=ok(1))


# -- the fake package ---------------------------------------------------------------------------


class Format(enum.Enum):
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"


@dataclasses.dataclass
class DelayedScaling:
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    scaling_factor_compute_algo: Any = None


@dataclasses.dataclass
class Record:
    built: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    regions: list[tuple[str, str, Any]] = dataclasses.field(default_factory=list)  # api, event
    depth: int = 0
    forward_depths: list[int] = dataclasses.field(default_factory=list)
    backward_depths: list[int] = dataclasses.field(default_factory=list)

    def entered(self, api: str | None = None) -> list[Any]:
        return [r for a, e, r in self.regions if e == "enter" and api in (None, a)]


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module


def install_fake_te(monkeypatch: pytest.MonkeyPatch, *, te2: bool = True) -> Record:
    """Put a fake ``transformer_engine`` into sys.modules; ``te2``: with ``te.autocast``."""
    record = Record()

    class Linear(nn.Linear):
        def __init__(
            self,
            in_features: int,
            out_features: int,
            bias: bool = True,
            *,
            params_dtype: torch.dtype | None = None,
            device: Any = "cuda",
        ) -> None:
            super().__init__(
                in_features, out_features, bias=bias, device=device, dtype=params_dtype
            )
            shape, where = (in_features, out_features), torch.device(device)
            record.built.append(
                {"shape": shape, "bias": bias, "dtype": params_dtype, "device": where}
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            record.forward_depths.append(record.depth)
            out = super().forward(x)
            if out.requires_grad:
                out.register_hook(lambda g: record.backward_depths.append(record.depth))
            return out

    @contextmanager
    def region(api: str, recipe: Any) -> Iterator[None]:
        record.regions.append((api, "enter", recipe))
        record.depth += 1
        try:
            yield
        finally:
            record.depth -= 1
            record.regions.append((api, "exit", recipe))

    def fp8_autocast(
        enabled: bool = True,
        calibrating: bool = False,
        fp8_recipe: Any = None,
        fp8_group: Any = None,
    ) -> Any:
        assert enabled
        return region("fp8_autocast", fp8_recipe)

    def autocast(
        enabled: bool = True,
        calibrating: bool = False,
        recipe: Any = None,
        amax_reduction_group: Any = None,
    ) -> Any:
        assert enabled
        return region("autocast", recipe)

    root = _module("transformer_engine")
    pytorch = _module("transformer_engine.pytorch")
    common = _module("transformer_engine.common")
    recipe = _module("transformer_engine.common.recipe")
    pytorch.Linear = Linear  # type: ignore[attr-defined]
    pytorch.fp8_autocast = fp8_autocast  # type: ignore[attr-defined]
    if te2:
        pytorch.autocast = autocast  # type: ignore[attr-defined]
    recipe.DelayedScaling = DelayedScaling  # type: ignore[attr-defined]
    recipe.Format = Format  # type: ignore[attr-defined]
    root.pytorch, root.common, common.recipe = pytorch, common, recipe  # type: ignore[attr-defined]
    for module in (root, pytorch, common, recipe):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return record


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> Record:
    return install_fake_te(monkeypatch)


@pytest.fixture
def no_te(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        monkeypatch.setitem(sys.modules, name, None)


# -- a model with layers of every kind --------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 64)
        self.blocks = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48, bias=False))
        self.odd = nn.Linear(64, 10)  # 10 is no multiple of 16
        self.head = nn.Linear(48, 32)  # the last Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.proj(x)
        return self.head(self.blocks(p)) + self.odd(p).mean(-1, keepdim=True)


def net() -> Net:
    torch.manual_seed(0)
    return Net()


def prepare(model: Any, stack: ExitStack, optimizer: Any = None, **params: Any) -> tuple[Step, Fix]:
    fix = Fix("precision.fp8", **params)
    target = Step(model=model, optimizer=optimizer, device_type="cuda", system=h100())
    fix.spec.prepare(fix.params, target, stack)
    stack.enter_context(fix.spec.scope(fix.params, target))
    return target, fix


# -- swapping -----------------------------------------------------------------------------------


def test_converts_linear_layers_whose_dimensions_divide_by_16(fake_te: Record) -> None:
    model = net().double()
    te_linear = sys.modules["transformer_engine.pytorch"].Linear  # type: ignore[attr-defined]
    with ExitStack() as stack:
        target, _ = prepare(model, stack)
        assert type(model.proj) is te_linear
        assert type(model.blocks[0]) is te_linear
        assert type(model.blocks[2]) is te_linear
        assert type(model.odd) is nn.Linear
        assert type(model.head) is nn.Linear
        f64, cpu = torch.float64, torch.device("cpu")
        assert fake_te.built == [
            {"shape": (32, 64), "bias": True, "dtype": f64, "device": cpu},
            {"shape": (64, 64), "bias": True, "dtype": f64, "device": cpu},
            {"shape": (64, 48), "bias": False, "dtype": f64, "device": cpu},
        ]
        (note,) = [n for n in target.notes if n.startswith("precision.fp8:")]
        assert "3 Linear layer(s) now te.Linear" in note
        assert "2 kept" in note
        assert "odd (64x10: FP8 needs both dimensions divisible by 16)" in note
        assert "head (the last Linear layer" in note


def test_values_are_copied_exactly_and_the_output_is_unchanged(fake_te: Record) -> None:
    model = net()
    original = copy.deepcopy(model)
    x = torch.randn(4, 32)
    with ExitStack() as stack:
        prepare(model, stack)
        assert model.proj.weight is not original.proj.weight
        assert torch.equal(model.proj.weight, original.proj.weight)
        assert torch.equal(model.proj.bias, original.proj.bias)
        assert model.blocks[2].bias is None
        assert torch.equal(model(x), original(x))


def test_revert_puts_back_the_original_modules_with_what_was_trained(fake_te: Record) -> None:
    model = net()
    layers = dict(model.named_modules())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with ExitStack() as stack:
        prepare(model, stack)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # after the swap
        model(torch.randn(4, 32)).square().mean().backward()
        optimizer.step()
        trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert dict(model.named_modules()) == layers
    assert all(module is layers[name] for name, module in model.named_modules())
    assert "forward" not in vars(model)
    after = model.state_dict()
    assert after.keys() == trained.keys()
    assert all(torch.equal(after[k], trained[k]) for k in after)
    assert not torch.equal(after["proj.weight"], before["proj.weight"])


def test_skip_patterns_tied_weights_and_keep_last(fake_te: Record) -> None:
    fix = Fix.parse("precision.fp8:skip=blocks.*+proj,keep_last=false")
    assert fix.params["skip"] == ["blocks.*", "proj"]
    assert Fix.parse(fix.label) == fix
    model = net()
    with ExitStack() as stack:
        target, _ = prepare(model, stack, **fix.params)
        converted = [n for n, m in model.named_modules() if type(m) is not nn.Linear]
        assert [n for n in converted if n in ("proj", "blocks.0", "blocks.2", "head")] == ["head"]
        assert "proj (skipped by name ('proj'))" in target.notes[0]
        assert "blocks.0 (skipped by name ('blocks.*'))" in target.notes[0]

    tied = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.ReLU())
    tied[1].weight = tied[0].weight
    shared = nn.Linear(32, 32)
    twice = nn.Sequential(shared, nn.ReLU(), shared)
    convert, kept = fp8_linear_plan(tied, Fix("precision.fp8").params)
    assert [n for n, _ in convert] == []
    assert dict(kept) == {
        "0": "shared with another module (tied weights)",
        "1": "shared with another module (tied weights)",
        "2": "the last Linear layer, usually the output head (keep_last)",
    }
    convert, kept = fp8_linear_plan(twice, Fix("precision.fp8", keep_last=False).params)
    assert (convert, kept) == ([], [("0", "shared with another module (tied weights)")])


def test_nothing_to_convert_is_an_error_naming_why(fake_te: Record) -> None:
    model = nn.Sequential(nn.Linear(20, 20), nn.Linear(20, 16))
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="no Linear layer") as err:
        prepare(model, stack)
    assert "20x20" in str(err.value)
    assert type(model[0]) is nn.Linear


# -- the FP8 region -----------------------------------------------------------------------------


@pytest.mark.parametrize("te2", [True, False], ids=["te.autocast", "te.fp8_autocast"])
def test_each_forward_runs_in_its_own_fp8_region_with_the_recipe(
    monkeypatch: pytest.MonkeyPatch, te2: bool
) -> None:
    record = install_fake_te(monkeypatch, te2=te2)
    model = net()
    with ExitStack() as stack:
        prepare(
            model, stack, fp8_format="E4M3", amax_history_len=32, amax_compute_algo="most_recent"
        )
        assert record.regions == []  # nothing entered outside a forward
        for _ in range(2):
            model(torch.randn(4, 32)).sum().backward()
    api = "autocast" if te2 else "fp8_autocast"
    recipes = record.entered(api)
    assert len(recipes) == 2
    assert [e for _, e, _ in record.regions] == ["enter", "exit"] * 2
    assert recipes[0] is recipes[1]
    assert recipes[0] == DelayedScaling(
        fp8_format=Format.E4M3, amax_history_len=32, amax_compute_algo="most_recent"
    )
    assert record.forward_depths == [1] * 6  # three converted layers, two forwards
    assert record.backward_depths  # the hook ran
    assert set(record.backward_depths) == {0}  # the backward outside the region


def test_code_builds_the_same_recipe_as_the_fix(fake_te: Record) -> None:
    fix = Fix("precision.fp8", fp8_format="E4M3", amax_history_len=64)
    (line,) = [c for c in fix.code() if c.startswith("fp8_recipe = ")]
    scope: dict[str, Any] = {"DelayedScaling": DelayedScaling, "Format": Format}
    exec(line, scope)
    with ExitStack() as stack:
        prepare(net(), stack, **fix.params)[0].model(torch.randn(2, 32))
    assert scope["fp8_recipe"] == fake_te.entered()[0]
    assert any("te.autocast(enabled=True, recipe=fp8_recipe)" in c for c in fix.code())


# -- gating and refusals ------------------------------------------------------------------------


def test_needs_fp8_tensor_cores_and_transformer_engine(fixtures_dir: Path, no_te: None) -> None:
    a100 = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "a100-sxm4-v12.xml")
    ok_, why = Fix("precision.fp8").supported(a100)
    assert not ok_
    assert "compute capability 8.0" in why
    assert "8.9+" in why
    ok_, why = Fix("precision.fp8").supported(h100())
    assert not ok_
    assert "transformer-engine[pytorch]" in why
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match=r"transformer-engine\["):
        prepare(net(), stack)


def test_supported_and_tryable_on_an_h100_with_transformer_engine(fake_te: Record) -> None:
    assert Fix("precision.fp8").supported(h100()) == (True, "")
    assert Fix("precision.fp8").tryable(h100()) == (True, "")
    assert not Fix("precision.fp8").supported(cpu_system("avx512_bf16"))[0]


def test_apply_to_a_users_model_and_revert(fake_te: Record) -> None:
    model = net()
    layers = dict(model.named_modules())
    x = torch.randn(4, 32)
    expected = model(x)
    with Fix("precision.fp8").apply(model, system=h100(), device_type="cuda") as handle:
        assert handle.model is model
        assert type(model.proj) is not nn.Linear
        assert torch.equal(model(x), expected)
        assert len(fake_te.entered()) == 1
        assert any("build the optimizer" in n for n in handle.notes)
    assert all(module is layers[name] for name, module in model.named_modules())
    assert "forward" not in vars(model)


def test_a_given_optimizer_is_refused_not_left_on_the_old_parameters(fake_te: Record) -> None:
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UnsupportedFixError, match=r"handle\.model\.parameters\(\)"):
        Fix("precision.fp8").apply(model, optimizer, system=h100(), device_type="cuda")
    assert type(model.proj) is nn.Linear
    assert "forward" not in vars(model)
    fix = Fix("precision.fp8")
    target = Step(model=model, optimizer=optimizer, owns_step=True, device_type="cuda")
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="copies=True"):
        fix.spec.prepare(fix.params, target, stack)


def test_refuses_without_a_module_or_on_the_cpu(fake_te: Record) -> None:
    spec, params = get_spec("precision.fp8"), Fix("precision.fp8").params
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match=r"torch\.nn\.Module"):
        spec.prepare(params, Step(model=None, device_type="cuda"), stack)
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="on the CPU"):
        spec.prepare(params, Step(model=net(), device_type="cpu"), stack)


# -- in a trial -----------------------------------------------------------------------------------


def test_a_trial_builds_its_optimizer_on_the_converted_parameters(fake_te: Record) -> None:
    model = net()
    workload = Workload(
        model,
        batch=lambda n: torch.randn(n, 32),
        loss=lambda m, b: m(b).square().mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        batch_size=4,
    )
    arm = Arm("fp8", (Fix("precision.fp8"),), workload, copy.deepcopy(model), False, "cuda", h100())
    arm.open()
    try:
        arm.new_optimizer()
        optimized = {id(p) for g in arm.target.optimizer.param_groups for p in g["params"]}
        assert {id(p) for p in arm.base_model.parameters()} == optimized
        converted = arm.base_model.proj
        assert type(converted) is not nn.Linear
        assert id(converted.weight) in optimized
        before = converted.weight.detach().clone()
        with arm.active():
            loss, norm = arm.step(record=True)
        assert loss is not None
        assert norm is not None
        assert not torch.equal(converted.weight, before)  # the optimizer moved the FP8 layer
        assert len(fake_te.entered()) == 1
        assert any("3 Linear layer(s)" in n for n in arm.notes)
    finally:
        arm.close()
    assert type(arm.base_model.proj) is nn.Linear
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
