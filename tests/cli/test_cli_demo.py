"""`gpudiag demo`: the quick part runs here; the recipe it prints is the file it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.cli.demo import save_recipe
from gpudiag.errors import GpuDiagError
from gpudiag.recipe import Recipe
from tests.experiment.test_compare_fake_clock import fake_step, run


def test_quick_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "This machine (live)" in out
    assert "256 threads already gives the highest occupancy" in out
    assert "fewer registers lift it" in out


def test_the_recipe_the_demo_prints_is_written_where_it_loads_it(
    tmp_path: Path, fake_clock: Any, bf16_cpu: Any
) -> None:
    comparison = run(fake_clock, bf16_cpu, fake_step(fake_clock), ["precision.bf16"])
    path = save_recipe(comparison, tmp_path / "demo-out")
    assert path == tmp_path / "demo-out" / "recipe.yaml"
    loaded = Recipe.load(path)
    assert [f.id for f in loaded.fixes] == ["precision.bf16"]
    assert f"gd.Recipe.load({str(path)!r})" in comparison.recipe().to_python(path=str(path))


def test_an_unwritable_folder_is_explained(tmp_path: Path, fake_clock: Any, bf16_cpu: Any) -> None:
    comparison = run(fake_clock, bf16_cpu, fake_step(fake_clock), ["precision.bf16"])
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(GpuDiagError, match="pass --out a writable folder"):
        save_recipe(comparison, blocker / "sub")
