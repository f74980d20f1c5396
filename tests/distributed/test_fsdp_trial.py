"""gd.compare(..., nproc=N): DDP vs FSDP2 on real ranks; the rank side in a 1-rank gloo group."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import gpudiag as gd
from gpudiag import workloads
from gpudiag.distributed.compare import DistributedComparison, launch
from gpudiag.distributed.group import DistributedError
from gpudiag.distributed.trial import run_rank
from gpudiag.distributed.workload import WorkloadSpecError, build
from gpudiag.errors import GpuDiagError
from gpudiag.experiment.compare import MEMORY_KEEP
from gpudiag.experiment.trial import GlobalState


def test_a_factory_workload_is_rebuilt_by_name() -> None:
    wl = build("tests.distributed.wl_factory:make", {"width": 4}, seed=3)
    assert wl.name == "wl_factory"
    assert wl.model[0].linear.in_features == 4
    again = build("tests.distributed.wl_factory:make", {"width": 4}, seed=3)
    assert torch.equal(wl.model[0].linear.weight, again.model[0].linear.weight)
    with pytest.raises(WorkloadSpecError, match=r"not a gd\.Workload"):
        build("tests.distributed.wl_factory:not_a_workload")
    with pytest.raises(WorkloadSpecError, match="cannot import"):
        build("tests.distributed.wl_factory:missing")
    with pytest.raises(WorkloadSpecError, match="unknown workload"):
        build("nope")


def test_bad_requests_fail_before_any_process_starts() -> None:
    gpt = workloads.get("gpt", seq_len=16)
    mine = gd.Workload(torch.nn.Linear(2, 1), batch=torch.randn(2, 2))
    with pytest.raises(WorkloadSpecError, match="module:function"):
        gd.compare(mine, fixes=["fsdp.wrap"], nproc=2)
    with pytest.raises(WorkloadSpecError, match=r"cannot find module 'no_such_pkg\.mod'"):
        gd.compare("no_such_pkg.mod:make", fixes=["fsdp.wrap"], nproc=2)
    with pytest.raises(DistributedError, match="nproc"):
        gd.compare(gpt, fixes=["fsdp.wrap"], nproc=0)
    with pytest.raises(DistributedError, match="unknown DDP option bucket"):
        gd.compare(gpt, fixes=["fsdp.wrap"], nproc=2, ddp={"bucket": 1})
    with pytest.raises(DistributedError, match="static_graph"):
        gd.compare(gpt, fixes=["fsdp.wrap"], nproc=2, accumulation=2, ddp={"static_graph": True})
    with pytest.raises(GpuDiagError, match="unknown argument"):
        gd.compare(gpt, fixes=["fsdp.wrap"], nproc=2, bogus=1)
    with pytest.raises(GpuDiagError, match="unknown argument"):
        gd.compare(gpt, fixes=[], ddp={})


def test_rank_side_runs_ddp_and_fsdp_arms_with_accumulation(one_rank_group: None) -> None:
    plan = {
        "workload": "tests.distributed.wl_factory:make",
        "overrides": {"width": 16},
        "arms": [
            {"label": "ddp", "strategy": "ddp"},
            {"label": "fsdp", "strategy": "fsdp", "params": {"wrap_classes": ["Layer"]}},
        ],
        "ddp": {"bucket_cap_mb": 1, "gradient_as_bucket_view": True},
        "accumulation": 2,
        "memory_steps": 2,
        "rounds": 2,
        "steps_per_round": 1,
    }
    ddp, fsdp = run_rank(plan, "cpu")
    for arm in (ddp, fsdp):
        assert arm.error == ""
        assert arm.peak_bytes is not None
        assert arm.peak_bytes >= arm.resident_bytes > 0
        assert len(arm.losses) == 2
        assert len(arm.step_s) == 2
        assert arm.slowest_step_s == arm.step_s  # one rank: it is the slowest
        assert arm.samples_per_step == 4
    assert fsdp.losses == pytest.approx(ddp.losses, rel=1e-5)
    assert ddp.losses[1] < ddp.losses[0]  # it trains
    assert "fully_shard on 3 Layer and the root" in fsdp.notes
    static = run_rank({**plan, "accumulation": 1, "ddp": {"static_graph": True}}, "cpu")
    assert static[0].error == ""
    assert static[0].losses[0] == pytest.approx(ddp.losses[0], rel=1e-5)
    bad = run_rank({**plan, "arms": [{"label": "x", "strategy": "fsdp",
                                      "params": {"wrap_classes": ["Nope"]}}]}, "cpu")  # fmt: skip
    assert "no module of class Nope" in bad[0].error


@pytest.mark.slow
def test_fsdp_cuts_every_ranks_peak_memory_on_the_demo_gpt() -> None:
    # Wide, with a large vocabulary and short sequences: parameters, gradients and Adam state
    # (what FSDP shards) dominate the step's memory, not activations.
    wl = workloads.get("gpt", seq_len=32, d_model=384, n_layer=2, vocab_size=16384)
    before = copy.deepcopy(wl.model.state_dict())
    state = GlobalState.capture()
    result = gd.compare(
        wl,
        fixes=["fsdp.wrap", "fsdp.wrap:mixed_precision=bf16"],
        nproc=2,
        rounds=2,
        steps_per_round=1,
        memory_steps=2,
        ddp={"gradient_as_bucket_view": True},
    )
    assert isinstance(result, DistributedComparison)
    assert result.nproc == 2
    assert result.backend == "gloo"
    assert [r["rank"] for r in result.ranks] == [0, 1]
    ddp = result.peak_bytes_per_rank("ddp (baseline)")
    fsdp = result.peak_bytes_per_rank("fsdp.wrap")
    # Sharded parameters, gradients and Adam state: every rank holds less than under DDP. (On a
    # CPU the profiler misses some frees made on gloo's threads, so FSDP's figure varies by up
    # to ~25 MiB between runs on a loaded host: the margin is kept loose.)
    peaks = f"FSDP {fsdp} vs DDP {ddp} bytes per rank"
    assert all(f is not None and d is not None for f, d in zip(fsdp, ddp, strict=True)), peaks
    assert all(f < d for f, d in zip(fsdp, ddp, strict=True)), peaks
    arm = result.arm("fsdp.wrap")
    assert arm.memory is not None
    assert result.memory_saving(arm) > MEMORY_KEEP, peaks  # kept by the recipe as a memory fix
    assert arm.drift is not None
    assert arm.drift.status == "ok"
    assert arm.drift.loss_rel is not None
    assert arm.drift.loss_rel < 1e-4
    bf16 = result.arm("fsdp.wrap:mixed_precision=bf16")
    assert bf16.drift is not None
    assert bf16.drift.loss_rel is not None
    assert bf16.drift.loss_rel > 0  # bf16 parameters change the numbers, and it is measured
    assert arm.speedup is not None
    assert arm.samples_per_s is not None
    assert result.baseline.samples_per_step == 2 * 2  # both ranks' batches
    assert "fsdp.wrap" in [f.id for f in result.recipe().fix_objects()]
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["nproc"] == 2
    assert result.plot() is not None
    assert "per rank" in result._repr_html_()
    assert len(doc["ranks"]) == 2
    assert "per rank:" in repr(result)
    # The caller's model and global switches were never touched.
    assert all(torch.equal(before[k], v) for k, v in wl.model.state_dict().items())
    assert state.differences(GlobalState.capture()) == []


@pytest.mark.slow
def test_a_rank_that_crashes_is_a_clear_error() -> None:
    # Both ranks fail reading the plan; whichever wrote first, its own error is reported, not
    # what the other said after losing it (tests/distributed/test_rank_failures.py).
    with pytest.raises(DistributedError, match=r"^the 2-rank trial failed: rank [01]: KeyError"):
        launch({"workload": "gpt"}, 2, timeout_s=120)


def test_live_bytes_retires_a_block_freed_unseen_on_another_thread() -> None:
    from gpudiag.distributed.trial import live_bytes

    events = [
        (0.0, 0xA, 100),  # allocated here, freed later on a thread the profiler does not see
        (1.0, 0xB, 50),
        (2.0, 0xB, -50),
        (3.0, 0xA, 30),  # same address again: the first block is gone
        (4.0, 0xC, -70),  # a block from before the session, freed with its size
    ]
    assert live_bytes(events) == (-40, 150)
    assert live_bytes([]) == (0, 0)


def test_gpu_memory_accounting_with_a_fake_allocator(
    one_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA path (untested on a real GPU) through a fake of gpudiag.probe.cuda's
    allocator counters: live after wrap + the steps' peak above their start."""
    from gpudiag.distributed import trial
    from gpudiag.distributed.trial import DdpOptions, RankArm, open_arm

    allocated = iter([1000, 5000, 5000])  # before build, after wrap, before the steps
    peaks = iter([9000, 12000])  # build's peak, the steps' peak
    resets: list[None] = []
    monkeypatch.setattr(trial.cuda, "memory_allocated", lambda device=None: next(allocated))
    monkeypatch.setattr(trial.cuda, "max_memory_allocated", lambda device=None: next(peaks))
    monkeypatch.setattr(
        trial.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(None)
    )
    arm = RankArm(label="fsdp", strategy="fsdp", params={"wrap_classes": ["Layer"]})

    def builder() -> gd.Workload:
        return build("tests.distributed.wl_factory:make", {"width": 8})

    open_arm(arm, builder, device="cuda:0", ddp=DdpOptions(), accumulation=1, memory_steps=2)
    assert len(resets) == 2
    assert arm.resident_bytes == 4000
    assert arm.init_peak_bytes == 8000
    assert arm.peak_bytes == 12000 - 5000 + 4000
    assert "max_memory_allocated" in arm.memory_method
    assert len(arm.losses) == 2
