"""%gpudiag memory / %%gpudiag memory in a real IPython shell, and `gpudiag memory --json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.cli import main
from gpudiag.experiment.trial import TrialSnapshot

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "memory-snapshots"


def test_cli_json_for_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "llama.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "vocab_size": 32000,
                "intermediate_size": 11008,
                "hidden_act": "silu",
            }
        )
    )
    code = main(
        [
            "memory",
            "--config",
            str(config),
            "--seq-len",
            "4096",
            "--inference",
            "--batch-size",
            "16",
            "--precision",
            "fp16",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["route"] == "formula"
    assert data["breakdown"]["kv_cache"] == 16 * 2 * 32 * 32 * 128 * 4096 * 2
    assert "memory.kv_cache_dominates" in {f["id"] for f in data["findings"]["findings"]}


def test_cli_snapshot_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--snapshot", str(SNAPSHOTS / "decomfl-memory.pickle.gz")]) == 0
    out = capsys.readouterr().out
    assert "memory.fragmentation" in out
    assert main(["memory", "--snapshot", "/nonexistent.pickle"]) == 1
    assert "memory snapshot not found" in capsys.readouterr().err


def test_cli_estimate_of_a_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["memory", "mlp", "--set", "hidden=128", "--estimate-only", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["route"] == "traced"
    assert data["peak_bytes"] > 0


def test_cell_magic_explains_an_oom_and_restores_the_cell_state(ipython_shell: Any) -> None:
    ip = ipython_shell
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1)
    )
    opt = torch.optim.Adam(model.parameters())
    ip.user_ns.update(model=model, opt=opt, x=torch.randn(512, 256))
    ip.user_ns.pop("loss", None)  # the shell is shared with other magic tests
    snap = TrialSnapshot.capture(model, opt)
    cell = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()"
    # A warm step starts with 1 MiB of parameters and 2 MiB of Adam state; its 4 MiB of
    # activations go past 5 MiB.
    report = ip.run_cell_magic("gpudiag", "memory --budget 5MiB", cell)
    assert report.oom is not None
    assert report.oom.overflowing_category == "activations"
    assert snap.differences() == []
    assert "loss" not in ip.user_ns  # the variable the cell made is gone again
    fine = ip.run_cell_magic("gpudiag", "memory", cell)
    assert fine.oom is None
    assert fine.peak_bytes > 4 * sum(p.numel() * 4 for p in model.parameters()) // 2
    assert snap.differences() == []


def test_line_magic_needs_something_to_measure(
    ipython_shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ipython_shell.run_line_magic("gpudiag", "memory")
    assert "%%gpudiag memory" in capsys.readouterr().out


def _adam_cell(ip: Any) -> tuple[Any, Any, str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1)
    )
    opt = torch.optim.Adam(model.parameters())
    ip.user_ns.update(model=model, opt=opt, x=torch.randn(512, 256))
    ip.user_ns.pop("loss", None)
    cell = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()"
    return model, opt, cell


def test_cell_magic_measures_a_warm_step_beside_the_estimate(ipython_shell: Any) -> None:
    import gpudiag as gd

    ip = ipython_shell
    model, opt, cell = _adam_cell(ip)
    snap = TrialSnapshot.capture(model, opt)
    report = ip.run_cell_magic("gpudiag", "memory", cell)
    adam_state = 2 * sum(p.numel() * 4 for p in model.parameters())
    # The optimizer state existed when the measured run began: a warm step, as gd.memory's.
    assert report.at_peak["optimizer_state"] >= adam_state
    assert "the cell ran twice: once to create the optimizer state" in repr(report)
    assert not opt.state  # the user's optimizer is as it was
    assert snap.differences() == []
    # The estimate column: the cell traced on fake copies of its model, optimizer and input.
    assert report.estimate is not None
    # (Adam's moments, and a step counter per parameter)
    assert adam_state <= report.estimate.breakdown["optimizer_state"] <= adam_state + 1024
    assert "estimate" in repr(report).splitlines()[0]
    # The same numbers gd.memory gives for the same step as a Workload.
    workload = gd.Workload(
        model,
        batch=lambda n: (ip.user_ns["x"],),
        loss=lambda m, b: m(b[0]).square().mean(),
        optimizer=lambda params: torch.optim.Adam(params),
        batch_size=512,
    )
    by_workload = gd.memory(workload)
    assert report.estimate.peak_bytes == by_workload.estimate.peak_bytes
    assert abs(report.peak_bytes - by_workload.peak_bytes) <= 0.05 * by_workload.peak_bytes
    assert report.plot() is not None  # the same timeline figure


def test_cell_magic_says_when_it_measured_the_first_step(ipython_shell: Any) -> None:
    ip = ipython_shell
    _, opt, cell = _adam_cell(ip)
    first = ip.run_cell_magic("gpudiag", "memory --first-step", cell)
    assert "measured the cell's first run (--first-step)" in repr(first)
    assert "the optimizer state did not exist yet" in repr(first)
    assert first.at_peak["optimizer_state"] == 0  # Adam made its state after the peak
    assert not opt.state
    bare = ip.run_cell_magic("gpudiag", "memory --no-estimate", cell)
    assert bare.estimate is None
    assert bare.at_peak["optimizer_state"] > 0


def test_cell_magic_follows_the_notebook_functions_the_cell_calls(ipython_shell: Any) -> None:
    ip = ipython_shell
    model, opt, _ = _adam_cell(ip)
    ip.run_cell(
        "def train_step():\n"
        "    model(x).square().mean().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    snap = TrialSnapshot.capture(model, opt)
    report = ip.run_cell_magic("gpudiag", "memory", "train_step()")
    assert report.estimate is not None  # the fakes reached the model through train_step
    assert report.at_peak["optimizer_state"] > 0
    assert snap.differences() == []  # ... and so did the restore
    assert not opt.state


FLEXGEN_13B = SNAPSHOTS / "flexgen-fork-opt-1.3b_snapshot.pickle"
FLEXGEN_OOM = SNAPSHOTS / "flexgen-fork-opt-oom_snapshot.pickle"


def test_cli_diff_of_two_snapshots(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["memory", "--diff", str(FLEXGEN_13B), str(FLEXGEN_OOM), "--by-function", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "memory_snapshot_diff"
    assert data["allocated_delta_bytes"] == 11_840_159_744 - 5_683_450_880
    assert data["rows"][0]["category"] == "parameters"
    assert main(["memory", "--diff", str(FLEXGEN_13B), str(SNAPSHOTS)]) == 1
    assert "not folders" in capsys.readouterr().err


def test_line_magic_diff_and_snapshot(ipython_shell: Any) -> None:
    ip = ipython_shell
    diff = ip.run_line_magic("gpudiag", f"memory --diff {FLEXGEN_13B} {FLEXGEN_OOM} --json")
    assert diff["allocated_delta_bytes"] == 11_840_159_744 - 5_683_450_880
    snap = ip.run_line_magic("gpudiag", f"memory --snapshot {FLEXGEN_OOM} --json")
    assert snap["allocated_bytes"] == 11_840_159_744
