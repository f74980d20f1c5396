"""cuda.graphs against a fake of torch.cuda.make_graphed_callables: capture, replay, fallbacks.

The fake follows the documented contract (PyTorch docs, torch.cuda.make_graphed_callables):
tensors-only sample args, no module hooks, no autocast cache; the module comes back with an
instance forward that replays; outputs and parameter gradients live in static buffers that
the next replay overwrites. It computes on the CPU what the graphs would compute.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gpudiag.errors import ProbeError, UnsupportedFixError
from gpudiag.experiment.runner import Arm, seed_everything
from gpudiag.fixes import Fix, Step, apply_fixes, get_spec
from gpudiag.fixes import cuda_graphs as cg
from gpudiag.fixes.cuda_graphs import GraphedForward
from gpudiag.probe import cuda
from gpudiag.probe.system import inspect
from gpudiag.step import Workload
from tests.fakes.machines import cpu_system

A100_XML = "a100-sxm4-v12.xml"


class FakeGraphs:
    """Stands in for ``gpudiag.probe.cuda.make_graphed_callables`` (one module per call)."""

    def __init__(self) -> None:
        self.captures: list[tuple[torch.Tensor, ...]] = []
        self.replays = 0

    def __call__(
        self,
        fn: nn.Module,
        sample_args: tuple[Any, ...],
        *,
        num_warmup_iters: int = 3,
        allow_unused_input: bool = False,
    ) -> nn.Module:
        if torch.is_autocast_enabled("cpu") and torch.is_autocast_cache_enabled():
            raise RuntimeError("make_graphed_callables does not support the autocast caching")
        if not all(isinstance(a, torch.Tensor) for a in sample_args):
            raise AssertionError("sample_args for each callable must contain only Tensors")
        if fn._forward_hooks or fn._forward_pre_hooks or fn._backward_hooks:
            raise AssertionError("Modules must not have hooks registered")
        self.captures.append(tuple(sample_args))
        params = tuple(p for p in fn.parameters() if p.requires_grad)
        original = fn.forward
        for _ in range(num_warmup_iters):
            out = original(*sample_args)
            torch.autograd.grad(out, params, torch.ones_like(out), allow_unused=allow_unused_input)
        static_in = tuple(sample_args)
        static_out = original(*static_in).detach().clone()
        static_grads = [torch.zeros_like(p) for p in params]
        fake = self

        class Replay(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> torch.Tensor:
                for static, given in zip(static_in, inputs, strict=False):
                    if static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                static_out.copy_(original(*static_in))
                fake.replays += 1
                return static_out.detach()

            @staticmethod
            def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
                with torch.enable_grad():
                    out = original(*static_in)
                    grads = torch.autograd.grad(out, params, grad_out, allow_unused=True)
                for static, grad in zip(static_grads, grads, strict=True):
                    if grad is not None:
                        static.copy_(grad)
                # an unused input's gradient is None, as torch's graphed backward returns it
                return (None,) * len(static_in) + tuple(
                    None if grad is None else static.detach()
                    for static, grad in zip(static_grads, grads, strict=True)
                )

        fn.forward = lambda *args: Replay.apply(*args, *params)  # type: ignore[method-assign]
        return fn


@pytest.fixture
def fake_graphs(monkeypatch: pytest.MonkeyPatch) -> FakeGraphs:
    fake = FakeGraphs()
    monkeypatch.setattr(cuda, "make_graphed_callables", fake)
    return fake


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.unused = nn.Linear(2, 2)  # no gradient, as in eager mode

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * scale


def net() -> Net:
    torch.manual_seed(0)
    return Net()


def graphed(model: nn.Module, stack: ExitStack, **target: Any) -> Step:
    fix = Fix("cuda.graphs")
    t = Step(model=model, owns_step=True, device_type=target.pop("device_type", "cuda"))
    for key, value in target.items():
        setattr(t, key, value)
    fix.spec.prepare(fix.params, t, stack)
    return t


def loss_and_grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach().clone(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def a100(fixtures_dir: Path) -> Any:
    return inspect(replay=fixtures_dir / "nvidia-smi-xml" / A100_XML)


# -- where it can run ----------------------------------------------------------------------------


def test_supported_only_with_a_cuda_gpu(fixtures_dir: Path) -> None:
    fix = Fix("cuda.graphs")
    assert fix.implemented
    assert fix.supported(cpu_system()) == (False, "CUDA graphs exist only on NVIDIA GPUs")
    assert fix.tryable(cpu_system()) == (False, "CUDA graphs exist only on NVIDIA GPUs")
    ok, why = fix.supported(cpu_system(), device_type="cuda")
    assert not ok
    assert "no GPU" in why
    assert fix.supported(a100(fixtures_dir)) == (True, "")
    assert fix.tryable(a100(fixtures_dir)) == (True, "")


def test_a_step_function_workload_is_refused() -> None:
    target = Step(model=net(), step_fn=lambda: None, owns_step=False, device_type="cuda")
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="step function"):
        Fix("cuda.graphs").spec.prepare({}, target, stack)
    assert "forward" not in vars(target.model)


def test_arms_sharing_the_users_model_are_refused() -> None:
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="own copy"):
        graphed(net(), stack, per_sample=True)


def test_buffers_that_require_grad_are_refused() -> None:
    model = net()
    model.register_buffer("scale", torch.ones(1, requires_grad=True))
    with ExitStack() as stack, pytest.raises(UnsupportedFixError, match="scale"):
        graphed(model, stack)


def test_a_users_model_is_skipped_with_the_plain_code(fixtures_dir: Path) -> None:
    model = net()
    applied = apply_fixes(
        [Fix("cuda.graphs")],
        model,
        system=a100(fixtures_dir),
        device_type="cuda",
        skip_unsupported=True,
    )
    assert applied.fixes == []
    [(fix, why)] = applied.skipped
    assert fix.id == "cuda.graphs"
    assert "trials only" in why
    assert "torch.cuda.make_graphed_callables(model" in why
    assert "forward" not in vars(model)
    with pytest.raises(UnsupportedFixError, match="trials only"):
        apply_fixes([Fix("cuda.graphs")], model, system=a100(fixtures_dir), device_type="cuda")


# -- capture and replay --------------------------------------------------------------------------


def test_first_call_captures_with_its_inputs_then_replays(fake_graphs: FakeGraphs) -> None:
    model, eager = net(), net()
    xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with ExitStack() as stack:
        target = graphed(model, stack)
        forward = vars(model)["forward"]
        assert isinstance(forward, GraphedForward)
        assert fake_graphs.captures == []  # nothing happens before the first call
        for x in xs:
            loss, grads = loss_and_grads(model, x)
            want_loss, want_grads = loss_and_grads(eager, x)
            assert torch.allclose(loss, want_loss)
            assert (
                grads.keys()
                == want_grads.keys()
                == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
            )
            for name in grads:
                assert torch.allclose(grads[name], want_grads[name]), name
        assert len(fake_graphs.captures) == 1
        [(sample,)] = fake_graphs.captures
        assert sample is not xs[0]
        assert torch.equal(sample, xs[-1])  # each replay copied its inputs into the sample
        assert torch.equal(xs[0], torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
        assert fake_graphs.replays == forward.replays == 3
        assert forward.eager_calls == 0
        assert any("captured Net.forward" in n and "float32[4, 8]" in n for n in target.notes)
    assert "forward" not in vars(model)


def test_keyword_and_non_tensor_arguments_run_eagerly_with_a_note(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    want = Net.forward(model, x, scale=2.0)
    with ExitStack() as stack:
        target = graphed(model, stack)
        assert torch.equal(model(x, scale=2.0), want)
        assert torch.equal(model(x, 2.0), want)
        assert fake_graphs.captures == []
        assert vars(model)["forward"].eager_calls == 2
    assert any("keyword arguments (scale)" in n for n in target.notes)
    assert any("argument 1 is a float" in n for n in target.notes)


def test_inputs_unlike_the_captured_ones_run_eagerly(fake_graphs: FakeGraphs) -> None:
    model, eager = net(), net()
    with ExitStack() as stack:
        target = graphed(model, stack)
        loss_and_grads(model, torch.randn(4, 8))
        small = torch.randn(3, 8)  # copied into the (4, 8) static input it would broadcast
        loss, grads = loss_and_grads(model, small)
        want_loss, want_grads = loss_and_grads(eager, small)
        assert torch.allclose(loss, want_loss)
        assert torch.allclose(grads["fc1.weight"], want_grads["fc1.weight"])
        model.eval()
        loss_and_grads(model, torch.randn(4, 8))
        assert len(fake_graphs.captures) == 1
        assert fake_graphs.replays == 1
    assert any("float32[3, 8]" in n and "differ from the captured" in n for n in target.notes)
    assert any("in eval mode" in n for n in target.notes)


def test_no_grad_runs_plainly_and_captures_nothing(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    with ExitStack() as stack, torch.no_grad():
        target = graphed(model, stack)
        assert torch.equal(model(x), Net.forward(model, x))
    assert fake_graphs.captures == []
    assert not any("cuda.graphs:" in n for n in target.notes)


def test_a_second_forward_before_the_backward_is_refused(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    with ExitStack() as stack:
        graphed(model, stack)
        first = model(x)
        with pytest.raises(UnsupportedFixError, match="before the backward pass"):
            model(x)
        first.sum().backward()
        model(x).sum().backward()  # one forward per backward replays again
    assert fake_graphs.replays == 2


def test_capture_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda, "make_graphed_callables", failing)
    with ExitStack() as stack:
        model = net()
        graphed(model, stack)
        with pytest.raises(
            UnsupportedFixError, match=r"could not capture Net\.forward.*\.item\(\)"
        ):
            model(torch.randn(4, 8))


def test_the_real_probe_function_needs_cuda() -> None:
    with pytest.raises(ProbeError, match="CUDA device"):
        cuda.make_graphed_callables(net(), (torch.randn(4, 8),))


def test_autocast_cache_is_off_only_for_the_capture(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    with ExitStack() as stack, torch.autocast("cpu", dtype=torch.bfloat16):
        target = graphed(model, stack, device_type="cpu")
        out = model(x)  # the fake raises when the cache is on
        assert torch.is_autocast_cache_enabled()
        out.float().sum().backward()
        assert out.dtype == torch.bfloat16
    assert len(fake_graphs.captures) == 1
    assert any("under bfloat16 autocast" in n for n in target.notes)


def test_revert_restores_a_forward_the_instance_already_had(fake_graphs: FakeGraphs) -> None:
    model, x = net(), torch.randn(4, 8)
    calls: list[int] = []

    def own(inp: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return Net.forward(model, inp)

    model.forward = own  # type: ignore[method-assign]
    with ExitStack() as stack:
        graphed(model, stack)
        assert vars(model)["forward"].__wrapped__ is own
        model(x).sum().backward()
    assert vars(model)["forward"] is own
    assert calls  # the captured forward was the instance's own


# -- with compile --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_compile_modes_that_capture_graphs_are_refused_either_way(mode: str) -> None:
    for first, second in [("compile", "cuda.graphs"), ("cuda.graphs", "compile")]:
        fixes = {"compile": Fix("compile", mode=mode), "cuda.graphs": Fix("cuda.graphs")}
        target = Step(model=net(), owns_step=True, device_type="cuda")
        with ExitStack() as stack:
            fixes[first].spec.prepare(fixes[first].params, target, stack)
            with pytest.raises(UnsupportedFixError, match="both capture CUDA graphs"):
                fixes[second].spec.prepare(fixes[second].params, target, stack)
        assert target.graph_capture == ""


def test_a_trial_captures_the_compiled_module_whatever_the_order_given(
    fake_graphs: FakeGraphs, fixtures_dir: Path
) -> None:
    model = net()
    workload = Workload(model, batch=lambda n: torch.randn(n, 8), loss=lambda m, b: m(b).sum())
    fixes = (Fix("cuda.graphs"), Fix("compile"))
    arm = Arm("both", fixes, workload, copy.deepcopy(model), False, "cuda", a100(fixtures_dir))
    arm.open()
    try:
        compiled = arm.target.model
        assert compiled is not arm.base_model
        assert isinstance(vars(compiled)["forward"], GraphedForward)
        assert arm.target.graph_capture == "cuda.graphs"
    finally:
        arm.close()
    assert "forward" not in vars(arm.base_model)


# -- in a trial ----------------------------------------------------------------------------------


def run_arm(fixes: tuple[Fix, ...], model: nn.Module, system: Any, steps: int = 3) -> Arm:
    workload = Workload(
        model,
        batch=lambda n: torch.randn(n, 8, generator=torch.Generator().manual_seed(7)),
        loss=lambda m, b: m(b).square().mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        batch_size=4,
    )
    arm = Arm("arm", fixes, workload, copy.deepcopy(model), False, "cuda", system)
    arm.open()
    try:
        seed_everything(0)
        arm.new_optimizer()
        arm.trace(steps, clock=lambda: 0.0)
    finally:
        arm.close()
    return arm


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_params(a: Arm, b: Arm) -> None:
    pa, pb = params_of(a.base_model), params_of(b.base_model)
    for name in pa:
        assert torch.allclose(pa[name], pb[name], atol=1e-6), name


def test_a_trial_step_replays_and_trains_like_eager(
    fake_graphs: FakeGraphs, fixtures_dir: Path
) -> None:
    system = a100(fixtures_dir)
    baseline = run_arm((), net(), system)
    arm = run_arm((Fix("cuda.graphs"),), net(), system)
    assert len(fake_graphs.captures) == 1
    assert fake_graphs.replays == 3
    assert_same_params(arm, baseline)
    assert not torch.equal(arm.base_model.fc1.weight, net().fc1.weight)  # it trained
    assert any("captured Net.forward" in n for n in arm.notes)  # noted while stepping
    assert "forward" not in vars(arm.base_model)


def test_gradient_accumulation_copies_gradients_out_of_the_graph(
    fake_graphs: FakeGraphs, fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = a100(fixtures_dir)
    split = Fix("batch.size", micro_batch=2, accumulation=2)
    baseline = run_arm((split,), net(), system)
    arm = run_arm((split, Fix("cuda.graphs")), net(), system)
    assert_same_params(arm, baseline)
    assert any("6 parameters are copied out" in n for n in arm.notes)
    assert all(not p._backward_hooks for p in arm.base_model.parameters())

    # Without the copies the second micro-batch's replay overwrites the first one's
    # gradients, which autograd took as the parameters' .grad (pytorch/pytorch#181723).
    monkeypatch.setattr(cg, "_clone_param_grads", lambda model, stack: 0)
    corrupted = run_arm((split, Fix("cuda.graphs")), net(), system)
    with pytest.raises(AssertionError):
        assert_same_params(corrupted, baseline)


def test_code_lines_name_the_documented_call() -> None:
    lines = get_spec("cuda.graphs").code({})
    assert any("torch.cuda.make_graphed_callables(model" in line for line in lines)
    assert any("cache_enabled=False" in line for line in lines)
