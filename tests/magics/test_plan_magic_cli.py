"""%gpudiag plan in a real IPython shell, and `gpudiag plan` on the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.experiment.plan import Plan

TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "topo-matrix"
H100_NODE = TOPO / "dstack-8xh100-sxm5-topo-m.txt"


def test_cli_json_for_a_known_model_on_a_recorded_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "plan",
            "llama3-8b",
            "--gpus",
            "8",
            "--topology",
            str(H100_NODE),
            "--seq-len",
            "8192",
            "--global-batch",
            "32",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "plan"
    assert data["gpu"] == "NVIDIA H100 SXM5 80GB"
    assert data["best"]["name"] == data["layouts"][0]["name"]
    assert any("NV18" in a for a in data["assumptions"])


def test_cli_text_from_sizes_and_from_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--layers", "30", "--hidden", "1536", "--heads", "12", "--vocab", "32000"]
    assert main(["plan", *args, "--gpus", "16", "--nodes", "2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Plan(")
    assert "  3. " in out
    assert "  4. " not in out
    assert "ruled out" in out
    assert "tensor parallelism across nodes" in out
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8})
    )
    assert main(["plan", str(config), "--gpus", "4", "--json", "--zero", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {lay["zero"] for lay in data["layouts"]} == {0}


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "no-such-model", "--gpus", "8"]) == 1
    assert "neither a known model" in capsys.readouterr().err
    assert main(["plan", "--gpus", "8"]) == 1
    assert "--layers" in capsys.readouterr().err
    assert main(["plan", "llama2-7b", "--gpus", "8", "--zero", "x"]) == 1
    assert "--zero" in capsys.readouterr().err
    assert main(["plan", "llama2-7b", "--gpus", "8", "--gpu", "Voodoo"]) == 1
    assert "spec table" in capsys.readouterr().err


def test_magic_plans_a_notebook_variable(ipython_shell: Any) -> None:
    ipython_shell.user_ns["cfg"] = {"layers": 8, "hidden": 1024, "heads": 16, "vocab_size": 1000}
    result = ipython_shell.run_line_magic("gpudiag", "plan cfg --gpus 4 --seq-len 1024")
    assert isinstance(result, Plan)
    assert result.gpus == 4
    assert result.parameters > 8 * 12 * 1024 * 1024
    as_dict = ipython_shell.run_line_magic("gpudiag", "plan llama2-7b --gpus 8 --json")
    assert as_dict["kind"] == "plan"


def test_magic_prints_errors(ipython_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ipython_shell.run_line_magic("gpudiag", "plan nothing --gpus 2") is None
    assert "neither a known model" in capsys.readouterr().out
