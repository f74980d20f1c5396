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
    report = ip.run_cell_magic("gpudiag", "memory --budget 3MiB", cell)
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
