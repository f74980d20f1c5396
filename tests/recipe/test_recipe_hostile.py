"""Hostile recipes: deep nesting, alias bombs, binary files, and names or values that would
inject a line into an exported script are refused with a RecipeError."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from gpudiag.errors import RecipeError
from gpudiag.fixes import Fix
from gpudiag.fixes.environment import NcclEnv
from gpudiag.recipe import Recipe
from gpudiag.recipe.model import MAX_DEPTH
from gpudiag.recipe.shell import check_env_name, env_value

ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else 'x'] * 10)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg", strict=True)
)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("deep.json", "[" * 100_000 + "]" * 100_000, "too deeply for a JSON recipe"),
        ("deep.yaml", "[" * 100_000 + "]" * 100_000, "too deeply for a YAML recipe"),
        (
            "nested.json",
            '{"fixes": [{"id": "nccl.env", "params": {"variables": {"NCCL_X": '
            + "[" * 500
            + "]" * 500
            + "}}}]}",
            f"more than {MAX_DEPTH} deep",
        ),
        ("bomb.yaml", ALIAS_BOMB, "more than 100000 values"),
        (
            "newline-name.yaml",
            'fixes:\n- id: nccl.env\n  params: {variables: {"NCCL_ALGO\\n": Ring}}\n',
            "not an NCCL variable",
        ),
        (
            "newline-value.yaml",
            'fixes:\n- id: nccl.env\n  params: {variables: {NCCL_ALGO: "Ring\\ntouch pwned"}}\n',
            "letters, digits",
        ),
        (
            "quote-value.json",
            '{"fixes": [{"id": "nccl.env", "params": {"variables": {"NCCL_ALGO": "\'$(id)\'"}}}]}',
            "letters, digits",
        ),
    ],
)
def test_hostile_files_are_refused(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RecipeError, match=message):
        Recipe.load(path)


def test_binary_and_huge_files_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "r.yaml"
    binary.write_bytes(b"fixes: []\n\xff\xfe\x00")
    with pytest.raises(RecipeError, match="not UTF-8"):
        Recipe.load(binary)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (5 * 1024 * 1024))
    with pytest.raises(RecipeError, match="larger than 4 MiB"):
        Recipe.load(huge)


@pytest.mark.parametrize(
    "name", ["NCCL_ALGO\n", "NCCL_ALGO\nrm", "nccl_algo", "1NCCL", "NCCL-ALGO", "", "A B", "É"]
)
def test_environment_names_are_checked(name: str) -> None:
    with pytest.raises(RecipeError, match=r"\[A-Z_\]\[A-Z0-9_\]\*"):
        check_env_name(name)
    with pytest.raises(ValueError, match="not an NCCL variable"):
        Fix("nccl.env", variables={name: "Ring"})


def test_exports_check_names_whatever_fix_produced_them(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = Recipe.of(["nccl.env:NCCL_ALGO=Ring"])
    assert recipe.to_env() == "export NCCL_ALGO=Ring\n"
    monkeypatch.setattr(NcclEnv, "env", lambda self, params: {"NCCL_X\necho injected": "1"})
    for export in (recipe.to_env, recipe.torchrun_command):
        with pytest.raises(RecipeError, match="not an environment variable name"):
            export()


@pytest.mark.parametrize("value", ["a b", "$(touch pwned)", "`id`", "x;y", "it's", "*", "~"])
def test_values_are_quoted_so_a_shell_reads_them_back(tmp_path: Path, value: str) -> None:
    # A real POSIX shell sources the export and prints the value back, byte for byte.
    script = tmp_path / "env.sh"
    script.write_text(f"export NCCL_TEST={env_value(value)}\n")
    out = subprocess.run(
        ["sh", "-c", f'. {shlex.quote(str(script))}; printf %s "$NCCL_TEST"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == value
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\0b"])
def test_values_with_line_breaks_are_refused(value: str) -> None:
    with pytest.raises(RecipeError, match="NUL or a line break"):
        env_value(value)


def test_python_snippet_keeps_recipe_text_in_comments(tmp_path: Path) -> None:
    evil = "gpt\nimport os; os.system('touch pwned')\r\u2028x"
    recipe = Recipe.of(["precision.bf16", "sync.remove:call_site=a\nb"], workload=evil)
    recipe = recipe.model_copy(update={"hardware": "H100\nimport os"})
    code = recipe.to_python()
    template = (
        "import gpudiag as gd",
        "",
        "applied = gd.Recipe.load('recipe.yaml').apply(model, optimizer=optimizer)",
        "print(applied)",
        "model = applied.model",
    )
    for line in code.splitlines():
        assert line.startswith("#") or line.startswith(template), line
    compile(code, "<snippet>", "exec")
