"""`%%gpudiag compare` in a real IPython shell and `gpudiag compare` in the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag.cli import main
from gpudiag.experiment.compare import Comparison
from gpudiag.recipe import Recipe

QUICK = "--min-rounds 3 --max-rounds 4 --budget 5"


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


@pytest.mark.slow
def test_cell_magic_runs_the_cell_as_the_workload(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    ip.user_ns.update(
        model=torch.nn.Linear(8, 2),
        x=torch.randn(16, 8),
        loss="the user's own value",
    )
    ip.user_ns["opt"] = torch.optim.SGD(ip.user_ns["model"].parameters(), lr=0.1)
    weight = ip.user_ns["model"].weight.detach().clone()
    cell = (
        "opt.zero_grad()\nloss = model(x).square().mean()\nloss.backward()\nopt.step()\n"
        "print('step!')\n"
    )
    result = ip.run_cell_magic(
        "gpudiag", f"compare --fix precision.bf16 --fix attention.backend=math {QUICK}", cell
    )
    assert isinstance(result, Comparison)
    assert torch.equal(ip.user_ns["model"].weight, weight)  # the notebook's model is untouched
    assert ip.user_ns["loss"] == "the user's own value"  # and its variables too
    assert "step!" not in capsys.readouterr().out
    bf16 = result.arm("precision.bf16")
    if bf16.error is None and bf16.drift is not None:
        assert bf16.drift.status in ("ok", "large")
    assert {a.label for a in result.arms} | {s for s, _ in result.skipped} == {
        "precision.bf16",
        "attention.backend=math",
    }


def test_line_magic_with_a_workload_variable(ip: Any) -> None:
    from gpudiag.workloads import mlp

    ip.user_ns["wl"] = mlp.build(batch_size=8, in_features=8, hidden=16)
    out = ip.run_line_magic(
        "gpudiag", f"compare --workload wl --fix attention.backend=math --json {QUICK}"
    )
    assert isinstance(out, dict)
    assert out["workload"] == "mlp"
    assert out["arms"][0]["label"] == "attention.backend=math"


def test_magic_without_cell_or_workload_explains(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ip.run_line_magic("gpudiag", "compare --fix precision.bf16") is None
    assert "cell magic" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_compare_json_and_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "r.yaml"
    argv = [
        "compare",
        "--workload",
        "mlp",
        "--set",
        "batch_size=8",
        "--set",
        "hidden=16",
        "--set",
        "in_features=8",
        "--fix",
        "attention.backend=math",
        "--fix",
        "precision.tf32",
        "--json",
        "--recipe",
        str(recipe),
        *QUICK.split(),
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == "mlp"
    assert data["skipped"][0]["label"] == "precision.tf32"
    assert isinstance(Recipe.load(recipe), Recipe)


def test_cli_compare_user_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--workload", "mlp", "--set", "hidden"]) == 1
    assert "key=value" in capsys.readouterr().err
    assert main(["compare", "--workload", "mlp"]) == 1
    assert "--fix" in capsys.readouterr().err
    assert main(["compare", "--workload", "nope", "--fix", "precision.bf16"]) == 1
    assert "choose one of" in capsys.readouterr().err
