"""Trials never harm the user's state: normal exit, exception, Ctrl-C, out-of-memory."""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from gpudiag.experiment.trial import GlobalState, TrialStateError, isolated, tensor_bytes

ENV_KEY = "GPUDIAG_TEST_TRIAL_VAR"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("table", torch.arange(4.0), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(idx))) + self.table.sum()


def _trained() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randint(0, 16, (6,))).square().mean().backward()
        opt.step()
    # Leave gradients pending, as a user between backward() and step() would.
    model(torch.randint(0, 16, (6,))).square().mean().backward()
    return model, opt


def _fingerprint(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    tensors = dict([*model.named_parameters(), *model.named_buffers()])
    return {
        "ids": {n: id(t) for n, t in tensors.items()},
        "values": {n: t.detach().clone() for n, t in tensors.items()},
        "dtypes": {n: t.dtype for n, t in tensors.items()},
        "grads": {
            n: (id(t.grad), t.grad.clone())
            for n, t in model.named_parameters()
            if t.grad is not None
        },
        "modules": [id(m) for m in model.modules()],
        "training": [m.training for m in model.modules()],
        "opt": copy.deepcopy(opt.state_dict()),
        "opt_state_ids": {id(p): id(s) for p, s in opt.state.items()},
        "globals": GlobalState.capture(),
    }


def _assert_same(before: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer) -> None:
    after = _fingerprint(model, opt)
    assert after["ids"] == before["ids"]
    assert after["dtypes"] == before["dtypes"]
    for name, value in before["values"].items():
        assert torch.equal(after["values"][name], value), name
    assert after["grads"].keys() == before["grads"].keys()
    for name, (gid, gval) in before["grads"].items():
        assert after["grads"][name][0] == gid
        assert torch.equal(after["grads"][name][1], gval)
    assert after["modules"] == before["modules"]
    assert after["training"] == before["training"]
    assert after["opt_state_ids"] == before["opt_state_ids"]
    a, b = after["opt"], before["opt"]
    assert a["param_groups"] == b["param_groups"]
    for key, state in b["state"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(a["state"][key][k]), torch.as_tensor(v)), (key, k)
    assert before["globals"].differences(after["globals"]) == []


def _mess_up(model: Net, opt: torch.optim.Optimizer) -> None:
    """Everything a careless trial could do."""
    model.train()
    for _ in range(2):
        model(torch.randint(0, 16, (6,))).square().mean().backward()
        opt.step()
    opt.param_groups[0]["lr"] = 10.0
    model.to(torch.bfloat16)
    model.body[1].running_mean.fill_(7.0)
    model.table.mul_(3)
    model.head.weight.requires_grad_(False)
    model.body[0] = nn.Linear(8, 8)  # a replaced submodule
    model.extra = nn.ReLU()
    model.eval()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_autocast_enabled("cpu", True)
    torch.set_autocast_dtype("cpu", torch.float16)
    torch.set_num_threads(1)
    os.environ[ENV_KEY] = "changed"
    torch.manual_seed(123)
    random.random()
    np.random.rand()


def _failing_trial(model: Net, opt: torch.optim.Optimizer, exc: BaseException) -> None:
    with isolated(model, opt):
        _mess_up(model, opt)
        raise exc


@pytest.fixture
def user_state() -> tuple[Net, torch.optim.Optimizer]:
    return _trained()


def test_normal_completion_restores_everything(user_state: Any) -> None:
    model, opt = user_state
    before = _fingerprint(model, opt)
    with isolated(model, opt):
        _mess_up(model, opt)
    _assert_same(before, model, opt)
    assert ENV_KEY not in os.environ


def test_exception_mid_trial_restores_and_reraises(user_state: Any) -> None:
    model, opt = user_state
    before = _fingerprint(model, opt)
    with pytest.raises(ValueError, match="boom"):
        _failing_trial(model, opt, ValueError("boom"))
    _assert_same(before, model, opt)


def test_keyboard_interrupt_restores_and_propagates(user_state: Any) -> None:
    model, opt = user_state
    before = _fingerprint(model, opt)
    with pytest.raises(KeyboardInterrupt):
        _failing_trial(model, opt, KeyboardInterrupt())
    _assert_same(before, model, opt)


def test_fake_allocator_oom_restores(user_state: Any) -> None:
    model, opt = user_state
    before = _fingerprint(model, opt)
    # torch's own error type, as the CUDA caching allocator raises it
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    with pytest.raises(torch.OutOfMemoryError):
        _failing_trial(model, opt, oom)
    _assert_same(before, model, opt)


def test_verification_reports_a_state_it_could_not_restore(
    user_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = user_state
    from gpudiag.experiment import trial

    monkeypatch.setattr(trial.TrialSnapshot, "restore", lambda self: None)

    def trial_that_cannot_be_undone() -> None:
        with isolated(model, opt), torch.no_grad():
            model.body[0].weight.add_(1.0)

    with pytest.raises(TrialStateError, match="values changed"):
        trial_that_cannot_be_undone()


def test_refuses_objects_it_cannot_protect() -> None:
    from gpudiag.errors import GpuDiagError

    with pytest.raises(GpuDiagError, match="modules and optimizers"), isolated(object()):
        pass


def test_tensor_bytes_counts_tied_weights_once() -> None:
    model = Net()
    expected = sum(
        t.numel() * t.element_size()
        for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    )
    assert tensor_bytes(model) == expected


OOM_SCRIPT = textwrap.dedent(
    """
    import resource, torch
    from gpudiag.experiment.trial import isolated
    from gpudiag.probe.cuda import is_oom_error

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 32)).sum().backward(); opt.step()
    before = [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]
    ids = [id(t) for t in [*model.parameters(), *model.buffers()]]
    momentum = [s["momentum_buffer"].clone() for s in opt.state.values()]

    with open("/proc/self/status") as fh:
        vm = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, hard))  # a memory cap
    caught = None
    try:
        with isolated(model, opt):
            model(torch.randn(4, 32)).sum().backward(); opt.step()
            torch.empty(8 * 2**30, dtype=torch.uint8)  # 8 GiB: over the cap
    except (RuntimeError, MemoryError) as exc:
        caught = exc
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    after = [t.detach() for t in [*model.parameters(), *model.buffers()]]
    print("oom", caught is not None and is_oom_error(caught))
    print("same_objects", ids == [id(t) for t in [*model.parameters(), *model.buffers()]])
    print("same_values", all(torch.equal(a, b) for a, b in zip(before, after)))
    moms = [s["momentum_buffer"] for s in opt.state.values()]
    print("same_momentum", all(torch.equal(a, b) for a, b in zip(momentum, moms)))
    """
)


@pytest.mark.slow  # a fresh interpreter imports torch
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_AS memory cap is Linux-only"
)
def test_real_out_of_memory_under_a_memory_cap_restores() -> None:
    out = subprocess.run(
        [sys.executable, "-c", OOM_SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split() for line in out.stdout.splitlines() if line.count(" ") == 1)
    assert lines == {
        "oom": "True",
        "same_objects": "True",
        "same_values": "True",
        "same_momentum": "True",
    }
