"""A user's step that hangs, exits, fails after a chdir or edits sys.argv / the environment:
every trial (compare, memory, fit, diagnose) ends with a gpudiag error and the state restored."""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import gpudiag as gd
from gpudiag.errors import GpuDiagError, StepFailedError
from gpudiag.experiment.step_limit import FACTOR, FIRST_STEP_S, FLOOR_S, StepLimit
from gpudiag.experiment.trial import GlobalState
from gpudiag.step import Step, constructor_settings, needs_closure


def _workload(action: Callable[[], None], *, at: int = 2, timeout: float | None = None) -> Any:
    model = torch.nn.Linear(8, 8)
    calls = [0]

    def loss(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] >= at:
            action()
        return m(x).pow(2).mean()

    return gd.Workload(
        model,
        batch=lambda bs: torch.randn(bs, 8),
        loss=loss,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        batch_size=4,
        step_timeout_s=timeout,
    )


def _process() -> tuple[str, list[str], dict[str, str], list[Any]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    switches = GlobalState.capture().switches
    return os.getcwd(), list(sys.argv), env, sorted(switches.items(), key=lambda kv: kv[0])


@pytest.fixture
def watched(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The working directory, sys.argv, the environment and torch's switches: unchanged."""
    monkeypatch.chdir(tmp_path)
    before = _process()
    yield
    after = _process()
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert after[2] == before[2]
    assert repr(after[3]) == repr(before[3])


def _hang() -> None:
    os.chdir("/")
    sys.argv.append("--left-behind")
    os.environ["GPUDIAG_TEST_LEAK"] = "1"
    time.sleep(600)


RUNS: dict[str, Callable[[Any], Any]] = {
    "compare": lambda wl: gd.compare(wl, ["precision.bf16"], progress=False, min_rounds=2),
    "memory": lambda wl: gd.memory(wl, estimate=False),
    "fit": lambda wl: gd.fit(wl, "64MiB"),
    "diagnose": lambda wl: gd.diagnose(wl, progress=False, scaling=False),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_hung_step_is_stopped_with_the_state_restored(name: str, watched: None) -> None:
    model_before = None
    wl = _workload(_hang, at=2, timeout=0.5)
    model_before = {k: v.clone() for k, v in wl.model.state_dict().items()}
    t0 = time.perf_counter()
    with pytest.raises(GpuDiagError, match=r"StepTimeoutError|did not finish within 0\.5 s"):
        RUNS[name](wl)
    assert time.perf_counter() - t0 < 60
    after = wl.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in model_before.items())


@pytest.mark.parametrize("name", list(RUNS))
def test_sys_exit_in_a_step_is_a_gpudiag_error(name: str, watched: None) -> None:
    wl = _workload(lambda: sys.exit(3))
    with pytest.raises(GpuDiagError, match=r"sys\.exit\(3\)"):
        RUNS[name](wl)


@pytest.mark.parametrize("name", ["memory", "fit", "diagnose"])
def test_a_failing_step_after_a_chdir_is_reported_and_the_folder_restored(
    name: str, watched: None
) -> None:
    def chdir_and_fail() -> None:
        os.chdir("/")
        raise RuntimeError("my step broke")

    with pytest.raises(StepFailedError, match="RuntimeError: my step broke") as info:
        RUNS[name](_workload(chdir_and_fail))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_keyboard_interrupt_passes_through_with_the_state_restored(watched: None) -> None:
    def interrupted() -> None:
        os.environ["GPUDIAG_TEST_LEAK"] = "1"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RUNS["compare"](_workload(interrupted))


def test_the_limit_follows_the_first_step() -> None:
    limit = StepLimit()
    assert limit.seconds() == FIRST_STEP_S
    limit.observe_first(0.01)
    assert limit.seconds() == FLOOR_S
    assert limit.seconds(steps=3) == 3 * FLOOR_S
    limit.observe_first(99.0)  # only the first observation counts
    assert limit.seconds(first=True, steps=2) == FIRST_STEP_S + FLOOR_S
    slow = StepLimit(reference_s=10.0)
    assert slow.seconds() == FACTOR * 10.0
    assert StepLimit(fixed_s=2.0, reference_s=10.0).seconds(steps=3) == 6.0
    fake = StepLimit(fallback=slow)
    assert fake.seconds() == FACTOR * 10.0  # a traced step borrows the real step's limit
    with pytest.raises(gd.WorkloadError, match="step_timeout_s must be a finite number"):
        _workload(lambda: None, timeout=float("nan"))
    with pytest.raises(gd.WorkloadError, match="step_timeout_s"):
        _workload(lambda: None, timeout=0)


def test_a_slow_first_step_of_a_compiling_arm_gets_the_long_limit() -> None:
    from gpudiag.experiment.runner import Arm
    from gpudiag.fixes import Fix

    wl = _workload(lambda: None, at=10**9)
    limit = StepLimit(reference_s=0.001)
    compiled = Arm("compile", (Fix("compile"),), wl, wl.model, True, "cpu", limit=limit)
    plain = Arm("bf16", (Fix("precision.bf16"),), wl, wl.model, True, "cpu", limit=limit)
    assert compiled._slow_first()
    assert not plain._slow_first()


def _optimizers() -> list[type[torch.optim.Optimizer]]:
    return [
        obj
        for name in dir(torch.optim)
        if isinstance(obj := getattr(torch.optim, name), type)
        and issubclass(obj, torch.optim.Optimizer)
        and obj is not torch.optim.Optimizer
    ]


@pytest.mark.parametrize("cls", _optimizers(), ids=lambda c: c.__name__)
def test_every_torch_optimizer_is_accepted_as_an_instance(cls: type) -> None:
    model = torch.nn.Linear(4, 2, bias=cls.__name__ != "Muon")  # Muon: 2-D parameters only
    kwargs = {"lr": 0.01} if "lr" in inspect.signature(cls).parameters else {}
    instance = cls(model.parameters(), **kwargs)
    wl = gd.Workload(
        model,
        batch=lambda bs: torch.randn(bs, 4),
        loss=lambda m, x: m(x).pow(2).mean(),
        optimizer=instance,
        batch_size=4,
    )
    step = Step.of(wl)
    step.new_optimizer()
    assert type(step.optimizer) is cls
    assert step.optimizer is not instance
    settings = constructor_settings(cls, instance.defaults)
    assert set(settings) <= set(inspect.signature(cls.__init__).parameters)
    if cls.__name__ == "SparseAdam":  # dense gradients: torch refuses, with its own message
        with pytest.raises(RuntimeError, match="SparseAdam does not support dense gradients"):
            step.run(record=True)
        return
    loss, norm = step.run(record=True)
    assert loss is not None
    assert norm is not None
    assert needs_closure(step.optimizer) == (cls.__name__ == "LBFGS")


def test_adamw_keeps_its_settings_when_rebuilt() -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05, betas=(0.8, 0.9))
    rebuilt = gd.Workload(model, batch=torch.randn(2, 4), optimizer=opt).optimizer_factory
    assert rebuilt is not None
    new = rebuilt(model.parameters())
    assert type(new) is torch.optim.AdamW
    assert new.defaults["lr"] == 3e-4
    assert new.defaults["weight_decay"] == 0.05
    assert new.defaults["betas"] == (0.8, 0.9)


def test_no_difference_on_a_busy_machine_is_undecided(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudiag.analysis.verdict import Judgement, median_ratio
    from gpudiag.experiment import compare as compare_module
    from gpudiag.experiment.busy import verdict_on
    from gpudiag.probe.contention import MachineLoad

    busy = MachineLoad(5.0, 2, 1.5, 0.0, 0.0, 4.0)
    quiet = MachineLoad(5.0, 2, 0.0, 0.0, 0.0, 0.2)
    assert verdict_on(busy, "no significant difference")[0] == "undecided"
    assert verdict_on(busy, "faster") == ("faster", "")
    assert verdict_on(quiet, "no significant difference") == ("no significant difference", "")
    monkeypatch.setattr(compare_module.contention, "between", lambda a, b: busy)
    # The evidence (gpudiag.analysis.verdict.judge) says no difference; the busy machine is
    # applied after it.
    monkeypatch.setattr(
        compare_module,
        "judge",
        lambda base, arm, plan, **kw: Judgement(
            "no significant difference", median_ratio(base, arm), len(arm), "inside the margin"
        ),
    )
    wl = _workload(lambda: None, at=10**9)
    result = gd.compare(
        wl, ["precision.bf16"], progress=False, min_rounds=2, max_rounds=2, adaptive=False,
        measure_memory=False, drift_steps=0, warmup_steps=1,
    )  # fmt: skip
    assert result.machine_load is busy
    arm = result.arm("precision.bf16")
    assert arm.verdict == "undecided"
    assert any("the machine was busy" in n for n in arm.notes)
    # What it needs, in the words every undecided arm uses (Judgement.needs)
    assert arm.judgement is not None
    assert arm.judgement.verdict == "undecided"
    assert arm.needs.endswith("measure again on a quieter machine")
    assert "measured (" in arm.needs  # the reasons the machine was busy
    assert any(
        line.startswith("precision.bf16: undecided: ") and "quieter machine" in line
        for line in result.evidence_lines()
    )
    assert any("busy during the timed rounds" in w for w in result.warnings())
    assert result.to_dict()["machine_load"]["busy"] is True
