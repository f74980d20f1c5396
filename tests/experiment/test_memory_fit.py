"""gd.fit: the largest micro-batch under a budget, confirmed by a measured step; what-ifs."""

from __future__ import annotations

import json

import pytest

import gpudiag as gd
from gpudiag import workloads
from gpudiag.errors import GpuDiagError
from gpudiag.fixes import Fix

MIB = 2**20


@pytest.fixture(scope="module")
def result() -> gd.FitResult:
    wl = workloads.get("gpt", seq_len=256, batch_size=8, d_model=64)
    return gd.fit(wl, memory_budget="20MiB")


def test_fit_finds_a_confirmed_micro_batch_that_keeps_the_global_batch(
    result: gd.FitResult,
) -> None:
    assert result.estimate.peak_bytes > 20 * MIB  # the batch of 8 does not fit as is
    assert result.micro_batch is not None
    assert result.accumulation is not None
    assert result.micro_batch * result.accumulation == 8
    assert result.confirmed
    assert result.measured_peak_bytes is not None
    assert result.measured_peak_bytes <= 20 * MIB
    # the next larger divisor would not fit by the estimate
    larger = result.micro_batch * 2
    assert result.estimate.at_batch(larger) > 20 * MIB
    fix = result.fix
    assert fix is not None
    assert fix.id == "batch.size"
    assert fix.params["micro_batch"] == result.micro_batch


def test_whatif_rows_carry_fix_ids_and_say_what_fits(result: gd.FitResult) -> None:
    by_label = {w.label: w for w in result.whatifs}
    assert by_label["as is (batch 8)"].fits is False
    assert by_label["bf16 + checkpointing"].peak_bytes is not None
    assert by_label["bf16 + checkpointing"].peak_bytes < by_label["bf16 autocast"].peak_bytes  # type: ignore[operator]
    assert by_label["FSDP over 8 GPUs"].peak_bytes < by_label["FSDP over 2 GPUs"].peak_bytes  # type: ignore[operator]
    assert by_label["expandable segments"].fits is None  # a CUDA setting: n/a on a CPU
    for w in result.whatifs:
        for text in w.fixes:
            Fix.parse(text)  # every row is a fix a recipe can carry
    assert any(w.fits for w in result.fitting())
    data = json.loads(json.dumps(result.to_dict()))
    assert data["fix"]["id"] == "batch.size"
    fig = result.plot()
    assert len(fig.data) >= 3
    assert "What fits" in result._repr_html_()


def test_a_batch_that_fits_as_is_says_how_far_it_could_grow(result: gd.FitResult) -> None:
    wl = workloads.get("gpt", seq_len=256, batch_size=2, d_model=64)
    roomy = gd.fit(wl, memory_budget="20MiB", confirm=False)
    assert roomy.accumulation == 1
    assert roomy.largest_batch == roomy.estimate.largest_batch(20 * MIB) > 2
    assert roomy.estimate.at_batch(roomy.largest_batch) <= 20 * MIB
    assert f"up to {roomy.largest_batch} samples a step would fit" in repr(roomy)
    assert result.largest_batch is not None
    assert result.largest_batch < 8  # the fixture's batch of 8 does not fit


def test_fit_errors() -> None:
    with pytest.raises(GpuDiagError):
        gd.fit(gd.Workload.from_step(lambda: None))
    wl = workloads.get("mlp", batch_size=8, hidden=64)
    with pytest.raises(GpuDiagError):
        gd.fit(wl, memory_budget="plenty")
