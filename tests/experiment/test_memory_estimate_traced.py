"""gd.estimate_memory's traced route: fake tensors under torch's memory tracker, vs a real step."""

from __future__ import annotations

import pytest
import torch

from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.estimate import estimate_memory, memory_fixes
from gpudiag.experiment.memory_report import measure_timeline
from gpudiag.step import Workload


@pytest.fixture(scope="module")
def gpt() -> Workload:
    return workloads.get("gpt", seq_len=128, batch_size=2, d_model=64)


def test_traced_estimate_matches_the_measured_step(gpt: Workload) -> None:
    before = {k: v.clone() for k, v in gpt.model.state_dict().items()}
    est = estimate_memory(gpt)
    measured = measure_timeline(gpt)
    assert est.route == "traced"
    assert est.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.05)
    # the categories at the peak agree too: parameters and optimizer state exactly
    assert est.breakdown["parameters"] == measured.at_peak["parameters"]
    assert est.breakdown["optimizer_state"] == measured.at_peak["optimizer_state"]
    n_params = sum(p.numel() for p in gpt.model.parameters())
    assert est.parameters == n_params
    # AdamW: two fp32 moments per parameter and a 4-byte step counter per tensor
    n_tensors = len(list(gpt.model.parameters()))
    assert est.breakdown["optimizer_state"] == 2 * 4 * n_params + 4 * n_tensors
    # the user's model was neither stepped nor given gradients
    after = gpt.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in gpt.model.parameters())


def test_bf16_and_checkpointing_shrink_the_traced_peak(gpt: Workload) -> None:
    base = estimate_memory(gpt, batch_size=4)
    bf16 = estimate_memory(gpt, batch_size=4, precision="bf16")
    ckpt = estimate_memory(gpt, batch_size=4, checkpointing=True)
    assert bf16.peak_bytes < 0.8 * base.peak_bytes
    assert ckpt.breakdown["activations"] < base.breakdown["activations"]
    measured = measure_timeline(gpt, batch_size=4, fixes=memory_fixes(None, True))
    assert ckpt.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.05)


def test_scaling_by_batch_predicts_a_larger_batch(gpt: Workload) -> None:
    est = estimate_memory(gpt, batch_size=2)
    assert est.per_sample_bytes
    assert est.per_sample_bytes > 0
    bigger = estimate_memory(gpt, batch_size=6)
    assert est.at_batch(6) == pytest.approx(bigger.peak_bytes, rel=0.03)


def test_parallelism_gives_the_per_gpu_figure(gpt: Workload) -> None:
    one = estimate_memory(gpt)
    fsdp = estimate_memory(gpt, parallelism="fsdp:4")
    for key in ("parameters", "gradients", "optimizer_state"):
        assert fsdp.breakdown[key] == pytest.approx(one.breakdown[key] / 4, abs=1)
    assert fsdp.breakdown["activations"] == one.breakdown["activations"]
    assert fsdp.peak_bytes == sum(fsdp.breakdown.values())


def test_a_module_with_inputs_and_a_named_optimizer() -> None:
    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).square().mean()

    model = Regressor()
    est = estimate_memory(
        model, inputs=lambda bs: torch.randn(bs, 32), batch_size=8, optimizer="sgd_momentum"
    )
    assert est.route == "traced"
    n = sum(p.numel() for p in model.parameters())
    assert est.breakdown["optimizer_state"] == 4 * n


def test_bad_input_is_a_clear_error(gpt: Workload) -> None:
    with pytest.raises(GpuDiagError, match="inputs="):
        estimate_memory(torch.nn.Linear(2, 2))
    with pytest.raises(GpuDiagError, match="cannot estimate"):
        estimate_memory("gpt")
    with pytest.raises(GpuDiagError, match="seq_len"):
        estimate_memory(gpt, seq_len=64)
    with pytest.raises(GpuDiagError, match="measures it"):
        estimate_memory(Workload.from_step(lambda: None, model=gpt.model))
    with pytest.raises(GpuDiagError, match="optimizer"):
        estimate_memory(gpt, optimizer="lion9000")
    with pytest.raises(GpuDiagError):
        estimate_memory(gpt, batch_size=0)


def test_cpu_kernel_scratch_is_counted_for_the_cnn() -> None:
    # oneDNN convolution / batch-norm backward hold input-sized scratch buffers (measured with
    # the profiler); without them the traced peak of the demo CNN was ~17 % low.
    cnn = workloads.get("cnn", batch_size=16)
    est = estimate_memory(cnn, scale_by_batch=False)
    measured = measure_timeline(cnn)
    assert est.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.05)
