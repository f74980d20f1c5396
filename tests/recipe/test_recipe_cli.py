"""`gpudiag recipe show|check|env|python|torchrun FILE` and `%gpudiag recipe`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.recipe import Recipe


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    return Recipe.of(["precision.tf32", "allocator.config"], workload="gpt").save(
        tmp_path / "r.yaml"
    )


def test_show_and_json(recipe_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "show", str(recipe_file)]) == 0
    assert "precision.tf32" in capsys.readouterr().out
    assert main(["recipe", "show", str(recipe_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"] == "gpt"


def test_check_fails_on_a_machine_that_cannot_take_it(
    recipe_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # This machine has no NVIDIA GPU: neither TF32 nor the CUDA allocator apply.
    assert main(["recipe", "check", str(recipe_file)]) == 1
    out = capsys.readouterr().out
    assert "SKIP precision.tf32" in out
    assert "TF32" in out


def test_env_python_torchrun(recipe_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "env", str(recipe_file)]) == 0
    assert capsys.readouterr().out == "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
    assert main(["recipe", "python", str(recipe_file)]) == 0
    assert "gd.Recipe.load(" in capsys.readouterr().out
    assert main(["recipe", "torchrun", str(recipe_file), "--nproc", "4", "--script", "t.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PYTORCH_CUDA_ALLOC_CONF=")
    assert "--nproc_per_node=4 t.py" in out


def test_bad_recipe_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("fixes:\n- id: go.faster\n")
    assert main(["recipe", "show", str(bad)]) == 1
    assert "unknown fix id 'go.faster'" in capsys.readouterr().err


def test_recipe_magic(
    recipe_file: Path, capsys: pytest.CaptureFixture[str], ipython_shell: Any
) -> None:
    ip = ipython_shell
    shown = ip.run_line_magic("gpudiag", f"recipe show {recipe_file}")
    assert isinstance(shown, Recipe)
    assert ip.run_line_magic("gpudiag", f"recipe env {recipe_file}") is None
    assert "export PYTORCH_CUDA_ALLOC_CONF" in capsys.readouterr().out
