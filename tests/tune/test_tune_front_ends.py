"""`%%gpudiag tune` in a real IPython shell and `gpudiag tune` in the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.cli import main
from gpudiag.recipe import Recipe
from gpudiag.tune import TuneResult
from gpudiag.tune import tune as gd_tune


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


def test_the_command_is_listed_in_both_front_ends(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert "--budget" in capsys.readouterr().out
    assert ip.run_line_magic("gpudiag", "tune") is None
    assert "use %%gpudiag tune as a cell magic" in capsys.readouterr().out
    assert ip.run_line_magic("gpudiag", "tune --budget -3") is None
    assert "--budget" in capsys.readouterr().out


@pytest.mark.slow
def test_cell_magic_tunes_the_cell_and_restores_the_notebook(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    ip.user_ns.update(model=torch.nn.Linear(8, 2), x=torch.randn(16, 8), loss="mine")
    ip.user_ns["opt"] = torch.optim.SGD(ip.user_ns["model"].parameters(), lr=0.1)
    weight = ip.user_ns["model"].weight.detach().clone()
    cell = "opt.zero_grad()\nloss = model(x).square().mean()\nloss.backward()\nopt.step()\n"
    result = ip.run_cell_magic(
        "gpudiag", "tune --no-diagnosis --fix precision.bf16 --fix batch.size --budget 10", cell
    )
    assert isinstance(result, TuneResult)
    assert torch.equal(ip.user_ns["model"].weight, weight)
    assert ip.user_ns["loss"] == "mine"
    # batch.size needs gpudiag's own step: a cell's step is skipped with the reason.
    assert any(label.startswith("batch.size") for label, _ in result.skipped)
    assert any(a.label == "precision.bf16" for a in result.history)


@pytest.mark.slow
def test_terminal_command_prints_json_and_saves_the_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "best.yaml"
    code = main(
        [
            "tune", "--workload", "mlp", "--set", "batch_size=2", "--set", "hidden=32",
            "--set", "in_features=16", "--no-diagnosis", "--fix", "batch.size",
            "--budget", "25", "--json", "--recipe", str(recipe),
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{") :])
    labels = {a["label"] for a in data["history"]}
    assert {"batch.size=4", "batch.size=8", "batch.size=16"} & labels
    if data["best"]["fixes"]:
        loaded = Recipe.load(recipe)
        assert [f.label for f in loaded.fixes] == [data["best"]["label"]]
    else:
        assert not recipe.exists()


@pytest.mark.slow
def test_nproc_measures_fsdp_on_real_ranks_beside_the_search() -> None:
    from gpudiag import workloads

    wl = workloads.get("gpt", seq_len=32, d_model=64, n_layer=1, vocab_size=512)
    result = gd_tune(wl, nproc=2, fixes=["fsdp.wrap"], diagnosis=False, time_budget_s=300)
    fsdp = next(a for a in result.history if a.label == "fsdp.wrap")
    assert fsdp.stage_name == "2 ranks"
    assert not fsdp.reason.startswith("not measured"), fsdp.reason
    assert fsdp.verdict is not None
    assert fsdp.rounds > 0
    # Its baseline is DDP on the ranks, not the one-process step: never best, never combined.
    assert result.best.is_baseline
    assert result.stages[-1].comparison is not None
    assert result.stages[-1].comparison.baseline.label == "ddp (baseline)"
