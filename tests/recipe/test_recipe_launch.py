"""Launch exports: torchrun command lines and SLURM batch scripts, run by a real shell with
stand-ins for scontrol, srun and torchrun that record what they receive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.errors import RecipeError
from gpudiag.recipe import Recipe

HOSTILE_ARGS = ["--name", "a b", "$(touch pwned)", "`touch pwned`", "x;touch pwned", "it's", "*"]
# Prints its own name, its arguments (one JSON list) and the variables a launch must carry.
RECORDER = """import json, os, sys
keys = ("NCCL_ALGO", "NCCL_IB_DISABLE", "PYTORCH_CUDA_ALLOC_CONF", "MASTER_ADDR", "MASTER_PORT")
argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
print(json.dumps({"argv": argv, "env": {k: os.environ.get(k) for k in keys}}))
"""


def _recipe() -> Recipe:
    return Recipe.of(["nccl.env:NCCL_ALGO=Ring", "allocator.config"], workload="gpt\nrm -rf / #")


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "srun"):
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n{RECORDER}")
        tool.chmod(0o755)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\nprintf "node-a\\nnode-b\\n"\n')
    scontrol.chmod(0o755)
    return bin_dir


def _run(cmd: list[str], fake_bin: Path, cwd: Path, **env: str) -> dict[str, object]:
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        cmd,
        cwd=cwd,
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_single_node_command(tmp_path: Path, fake_bin: Path) -> None:
    cmd = _recipe().torchrun_command("my train.py", nproc_per_node=4, args=HOSTILE_ARGS)
    assert cmd.startswith("NCCL_ALGO=Ring PYTORCH_CUDA_ALLOC_CONF=")
    assert "torchrun --standalone --nproc_per_node=4 " in cmd
    got = _run(["sh", "-c", cmd], fake_bin, tmp_path)
    assert got["argv"] == [
        "torchrun",
        "--standalone",
        "--nproc_per_node=4",
        "my train.py",
        *HOSTILE_ARGS,
    ]
    assert got["env"] == {
        "NCCL_ALGO": "Ring",
        "NCCL_IB_DISABLE": None,
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "MASTER_ADDR": None,
        "MASTER_PORT": None,
    }
    assert not (tmp_path / "pwned").exists()


def test_multi_node_command_expands_the_master_address(tmp_path: Path, fake_bin: Path) -> None:
    cmd = _recipe().torchrun_command("train.py", nproc_per_node=8, nnodes=2, rdzv_id="run-7")
    got = _run(["sh", "-c", cmd], fake_bin, tmp_path, MASTER_ADDR="10.0.0.5")
    assert got["argv"] == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500",
        "--rdzv-id=run-7",
        "train.py",
    ]


def test_slurm_script_runs_one_torchrun_per_node(tmp_path: Path, fake_bin: Path) -> None:
    text = _recipe().slurm_script(
        "my train.py",
        nodes=2,
        gpus_per_node=8,
        cpus_per_task=32,
        partition="gpu,debug",
        time="1-02:00:00",
        args=HOSTILE_ARGS,
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for directive in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=32",
        "#SBATCH --partition=gpu,debug",
        "#SBATCH --time=1-02:00:00",
    ):
        assert directive in lines
    # The workload name held a line break: it stays inside comments.
    assert "# rm -rf / #" in lines
    assert not any(line.startswith("rm") for line in lines)
    script = tmp_path / "job.sh"
    script.write_text(text)
    got = _run(
        ["bash", str(script)],
        fake_bin,
        tmp_path,
        SLURM_JOB_NODELIST="node-[a-b]",
        SLURM_JOB_ID="42",
    )
    assert got["argv"] == [
        "srun",
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-a:29500",
        "--rdzv-id=42",
        "my train.py",
        *HOSTILE_ARGS,
    ]
    env = got["env"]
    assert isinstance(env, dict)
    assert env["NCCL_ALGO"] == "Ring"
    assert env["MASTER_ADDR"] == "node-a"
    assert env["MASTER_PORT"] == "29500"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": "8; touch pwned"}, "nproc_per_node"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nnodes": "2\ntouch pwned"}, "nnodes"),
        ({"nnodes": 2, "rdzv_endpoint": "host:29500;id"}, "rdzv_endpoint"),
        ({"nnodes": 2, "rdzv_endpoint": "$(id):29500"}, "rdzv_endpoint"),
        ({"nnodes": 2, "rdzv_endpoint": "host:99999"}, "port"),
        ({"nnodes": 2, "rdzv_id": 'a"b'}, "rdzv_id"),
        ({"args": "--lr 3e-4"}, "list of words"),
    ],
)
def test_hostile_torchrun_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        _recipe().torchrun_command("train.py", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"job_name": "x\n#SBATCH --uid=0"}, "job_name"),
        ({"partition": "gpu\nrm -rf /"}, "partition"),
        ({"time": "1:00\ntouch pwned"}, "time"),
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": True}, "gpus_per_node"),
        ({"port": 70000}, "port"),
        ({"cpus_per_task": -1}, "cpus_per_task"),
    ],
)
def test_hostile_slurm_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        _recipe().slurm_script("train.py", **kwargs)  # type: ignore[arg-type]


def test_a_recipe_without_environment_exports_no_variables() -> None:
    recipe = Recipe.of(["precision.bf16"])
    assert recipe.torchrun_command() == "torchrun --standalone --nproc_per_node=gpu train.py"
    assert "export" not in recipe.slurm_script().replace("export MASTER", "")


def test_cli_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpudiag.cli import main

    path = _recipe().save(tmp_path / "r.yaml")
    assert main(["recipe", "slurm", str(path), "--nnodes", "4", "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=4" in out
    assert "srun torchrun --nnodes=4 --nproc-per-node=4" in out
    assert "export NCCL_ALGO=Ring" in out
    assert main(["recipe", "torchrun", str(path), "--nnodes", "2", "--nproc", "8"]) == 0
    assert '--rdzv-endpoint="$MASTER_ADDR:29500"' in capsys.readouterr().out
    assert main(["recipe", "slurm", str(path), "--partition", "gpu;id"]) == 1
    assert "partition 'gpu;id' is not a partition" in capsys.readouterr().err
