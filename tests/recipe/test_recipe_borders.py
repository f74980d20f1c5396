"""A recipe is data: NCCL plugin and file variables are refused on export unless allowed by
name, and every exported script parses (``bash -n``, ``py_compile``) whatever the values."""

from __future__ import annotations

import itertools
import py_compile
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.errors import RecipeError
from gpudiag.fixes import Fix
from gpudiag.fixes.environment import NCCL_TUNING, nccl_refusal
from gpudiag.recipe import Recipe

REFUSED = {
    "NCCL_NET_PLUGIN": "shared library",
    "NCCL_TUNER_PLUGIN": "shared library",
    "NCCL_PROFILER_PLUGIN": "shared library",
    "NCCL_ENV_PLUGIN": "shared library",
    "NCCL_DEBUG_FILE": "names a file",
    "NCCL_TOPO_FILE": "names a file",
    "NCCL_TOPO_DUMP_FILE": "names a file",
    "NCCL_GRAPH_DUMP_FILE": "names a file",
    "NCCL_CONF_FILE": "names a file",
    "NCCL_SOMETHING_NEW": "not an NCCL tuning variable",
}


def _recipe(**variables: str) -> Recipe:
    return Recipe.of([Fix("nccl.env", variables=variables)])


def _exports(recipe: Recipe, allow: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "env": lambda: recipe.to_env(allow=allow),
        "torchrun": lambda: recipe.torchrun_command(allow=allow),
        "slurm": lambda: recipe.slurm_script(allow=allow),
        "python": lambda: recipe.to_python(allow=allow),
    }


@pytest.mark.parametrize(("name", "why"), list(REFUSED.items()))
def test_plugin_and_file_variables_are_refused_on_every_export(name: str, why: str) -> None:
    assert why in nccl_refusal(name)
    recipe = _recipe(**{name: "/home/user/.bashrc", "NCCL_ALGO": "Ring"})
    for export in _exports(recipe).values():
        with pytest.raises(RecipeError, match=rf"sets {name}; refused: .*{why}.*--allow {name}"):
            export()
    for text in (f() for f in _exports(recipe, allow=(name,)).values()):
        assert name in text  # the user allowed it by name: exported, quoted
    checks = recipe.check()
    assert checks[0][1] is False
    assert f"{name} refused" in checks[0][2]
    applied = recipe.apply(device_type="cuda")
    assert any(f"{name} refused" in why for _, why in applied.skipped)


def test_tuning_variables_are_exported() -> None:
    assert {"NCCL_ALGO", "NCCL_PROTO", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG"} <= NCCL_TUNING
    recipe = _recipe(NCCL_ALGO="Ring", NCCL_MAX_NCHANNELS="8", NCCL_DEBUG="WARN")
    assert recipe.refused_env() == {}
    assert "export NCCL_ALGO=Ring" in recipe.to_env()


def test_the_command_line_refuses_then_allows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.yaml"
    _recipe(NCCL_NET_PLUGIN="libevil.so").save(path)
    assert main(["recipe", "env", str(path)]) == 1
    err = capsys.readouterr().err
    assert "NCCL_NET_PLUGIN" in err
    assert "shared library" in err
    assert main(["recipe", "env", str(path), "--allow", "NCCL_NET_PLUGIN"]) == 0
    assert "export NCCL_NET_PLUGIN=libevil.so" in capsys.readouterr().out


HOSTILE = [
    "${MASTER_ADDR:29500", "${MASTER_ADDR}:29500", "$MASTER_ADDR:29500", "$(reboot):1",
    "`id`:1", "host:1;rm -rf ~", "a'b", 'a"b', "a\nb", "a\0b", "a;b", "a|b", "a&b", "$HOME",
    "[::1]:29500", "node-1:99999", "²:1", "node٣:1", "--help", " ", "", "x" * 300, "é", "\\",
    "!!", "1:4", "0", "-1", "٨", "12:34:56", "2-00:00:00", "gpu", "auto",
]  # fmt: skip


def _parses(kind: str, text: str, path: Path) -> str:
    if kind == "python":
        path.write_text(text)
        try:
            py_compile.compile(str(path), doraise=True)
        except py_compile.PyCompileError as exc:
            return str(exc)
        return ""
    path.write_text(text)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    return done.stderr if done.returncode else ""


def test_every_export_parses_whatever_the_values(tmp_path: Path) -> None:
    recipe = _recipe(NCCL_ALGO="Ring", NCCL_SOCKET_IFNAME="eth0")
    produced: list[tuple[str, str, str]] = []
    refused = 0
    for value, other in itertools.product(HOSTILE, ["ok", "a b"]):
        attempts = {
            "torchrun endpoint": ("bash", lambda v=value: recipe.torchrun_command(
                nnodes=2, rdzv_endpoint=v)),
            "torchrun id": ("bash", lambda v=value: recipe.torchrun_command(
                nnodes=2, rdzv_id=v)),
            "torchrun script": ("bash", lambda v=value, o=other: recipe.torchrun_command(
                v, args=[o, v])),
            "torchrun nproc": ("bash", lambda v=value: recipe.torchrun_command(
                nproc_per_node=v)),
            "torchrun nnodes": ("bash", lambda v=value: recipe.torchrun_command(nnodes=v)),
            "slurm partition": ("bash", lambda v=value: recipe.slurm_script(partition=v)),
            "slurm time": ("bash", lambda v=value: recipe.slurm_script(time=v)),
            "slurm name": ("bash", lambda v=value: recipe.slurm_script(job_name=v)),
            "slurm script": ("bash", lambda v=value, o=other: recipe.slurm_script(
                v, args=[v, o])),
            "python path": ("python", lambda v=value: recipe.to_python(path=v)),
        }  # fmt: skip
        for label, (kind, make) in attempts.items():
            try:
                produced.append((label, kind, make()))
            except RecipeError:
                refused += 1
    assert refused > 0
    problems = []
    for i, (label, kind, text) in enumerate(produced):
        why = _parses(kind, text, tmp_path / f"export{i}.{'py' if kind == 'python' else 'sh'}")
        if why:
            problems.append(f"{label}: {why.strip()[:200]}")
    assert problems == []
    assert len(produced) > 100


def test_a_braced_variable_must_be_closed() -> None:
    recipe = _recipe(NCCL_ALGO="Ring")
    with pytest.raises(RecipeError, match="rdzv_endpoint"):
        recipe.torchrun_command(nnodes=2, rdzv_endpoint="${MASTER_ADDR:29500")
    assert '--rdzv-endpoint="${MASTER_ADDR}:29500"' in recipe.torchrun_command(
        nnodes=2, rdzv_endpoint="${MASTER_ADDR}:29500"
    )
