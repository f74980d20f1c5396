"""Recipes as data: versioned schema, safe YAML / JSON, clear rejections, exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpudiag.errors import RecipeError
from gpudiag.fixes import Fix
from gpudiag.recipe import SCHEMA_VERSION, Evidence, Recipe, RecipeFix


def sample() -> Recipe:
    evidence = Evidence(
        speedup=2.5,
        speedup_low=2.3,
        speedup_high=2.7,
        confidence=0.95,
        verdict="faster",
        loss_drift=0.001,
        hardware="CPU Test",
    )
    return Recipe(
        workload="gpt",
        fixes=[
            RecipeFix(id="precision.bf16", evidence=evidence),
            RecipeFix(id="attention.backend", params={"backend": "flash"}),
            RecipeFix(id="allocator.config", params={"max_split_size_mb": 128}),
            RecipeFix(id="nccl.env", params={"variables": {"NCCL_ALGO": "Ring"}}),
        ],
    )


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_load_round_trip(tmp_path: Path, suffix: str) -> None:
    recipe = sample()
    path = recipe.save(tmp_path / f"r{suffix}")
    loaded = Recipe.load(path)
    assert loaded == recipe
    assert loaded.fix_objects()[1] == Fix("attention.backend", backend="flash")
    assert loaded.fixes[0].evidence is not None
    assert loaded.fixes[0].evidence.speedup == 2.5


def test_yaml_is_plain_data(tmp_path: Path) -> None:
    text = sample().save(tmp_path / "r.yaml").read_text()
    data = yaml.safe_load(text)
    assert data["kind"] == "gpudiag.recipe"
    assert data["schema_version"] == SCHEMA_VERSION
    assert "!!python" not in text


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: gpudiag.recipe\nfixes:\n- id: precision.bf17\n", "unknown fix id 'precision.bf17'"),
        ("fixes:\n- id: compile\n  params: {mod: default}\n", "mod"),
        ("fixes:\n- id: attention.backend\n  params: {backend: warp}\n", "backend"),
        ("schema_version: 99\nfixes: []\n", "newer than this gpudiag"),
        ("fixes:\n- id: precision.bf16\n- id: precision.fp16\n", "same thing"),
        ("fixes: []\nsurprise: 1\n", "surprise"),
        ("kind: something.else\n", "not a gpudiag recipe"),
        ("- just\n- a list\n", "a recipe is a mapping"),
        ("fixes: [\n", "not valid YAML"),
        (
            "fixes:\n- id: nccl.env\n  params: {variables: {NCCL_ALGO: 'Ring; rm -rf /'}}\n",
            "letters, digits",
        ),
    ],
)
def test_bad_recipes_are_rejected_clearly(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        Recipe.load(write(tmp_path, text))


def test_python_objects_in_yaml_are_never_constructed(tmp_path: Path) -> None:
    evil = "fixes: !!python/object/apply:os.system ['echo pwned > pwned.txt']\n"
    with pytest.raises(RecipeError, match="not valid YAML"):
        Recipe.load(write(tmp_path, evil))
    assert not (tmp_path / "pwned.txt").exists()


def test_missing_file() -> None:
    with pytest.raises(RecipeError, match="cannot read recipe"):
        Recipe.load("/nonexistent/recipe.yaml")


def test_env_exports_and_torchrun_line() -> None:
    recipe = sample()
    assert recipe.env_vars() == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
        "NCCL_ALGO": "Ring",
    }
    assert recipe.to_env().splitlines() == [
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128",
        "export NCCL_ALGO=Ring",
    ]
    cmd = recipe.torchrun_command("train.py", nproc_per_node=8, args=["--lr", "3e-4"])
    assert cmd.startswith("PYTORCH_CUDA_ALLOC_CONF=")
    assert "torchrun --standalone --nproc_per_node=8 train.py --lr 3e-4" in cmd


def test_to_python_is_valid_code_that_loads_the_recipe() -> None:
    code = sample().to_python(path="my_recipe.yaml")
    compile(code, "<snippet>", "exec")
    assert "gd.Recipe.load('my_recipe.yaml').apply(model, optimizer=optimizer)" in code
    assert "torch.autocast" in code
    assert "sdpa_kernel" in code
    assert "2.50x (95% CI 2.30-2.70x)" in code


def test_html_and_repr_escape(tmp_path: Path) -> None:
    recipe = Recipe.of(["precision.bf16"], workload="<b>x</b>")
    assert "&lt;b&gt;x&lt;/b&gt;" in recipe._repr_html_()
    assert "precision.bf16" in repr(recipe)
    assert json.loads(recipe.to_json())["workload"] == "<b>x</b>"


def test_fix_entries_are_normalised() -> None:
    entry = RecipeFix(id="attention.backend", params={"backend": "flash_attention_2"})
    assert entry.params == {"backend": "flash_attn"}
    assert RecipeFix(id="compile").params == {"mode": "default", "fullgraph": False}


def test_check_against_recorded_hardware(fixtures_dir: Path) -> None:
    from gpudiag.probe.system import inspect

    t4 = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "tesla-t4.xml")
    results = {f.id: (ok, why) for f, ok, why in sample().check(t4)}
    assert results["precision.bf16"][0] is False
    assert "7.5" in results["precision.bf16"][1]
    assert results["allocator.config"][0] is True
    assert "export before starting" in results["allocator.config"][1]
