"""Launch exports of a recipe: a ``torchrun`` command line and a SLURM batch script that start
a training script with the recipe's environment.

Every value that reaches the shell is either checked against a narrow pattern (numbers, node
counts, SLURM names, a rendezvous endpoint) or quoted with ``shlex.quote`` (script, arguments,
environment values); environment names are checked as ``[A-Z_][A-Z0-9_]*``. A value that does
not fit is a ``RecipeError``, never a line in the output. Options follow torchrun's
documentation (``--nnodes``, ``--nproc-per-node``, ``--rdzv-backend=c10d``, ``--rdzv-endpoint``,
``--rdzv-id``, ``--standalone``) and SLURM's sbatch (``--nodes``, ``--ntasks-per-node``,
``--gpus-per-node``, ``--cpus-per-task``, ``--time``, ``--partition``, ``--job-name``); one
torchrun per node (``--ntasks-per-node=1``) starts that node's ranks.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from gpudiag.errors import RecipeError
from gpudiag.recipe.shell import check_env_name, env_value

_NPROC_WORDS = ("gpu", "cpu", "auto")
_NNODES = re.compile(r"[1-9][0-9]{0,4}(:[1-9][0-9]{0,4})?")  # N or MIN:MAX (elastic)
# host:port, or a variable the shell expands on each node ($MASTER_ADDR:29500).
# ``$NAME`` or ``${NAME}``: braces in pairs, or bash cannot parse the line ("${MASTER_ADDR:29500").
_VARIABLE = r"\$(?:[A-Z_][A-Z0-9_]*|\{[A-Z_][A-Z0-9_]*\})"
_ENDPOINT = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,252})|\[[0-9A-Fa-f:.]+\]|" + _VARIABLE + r")"
    r":[0-9]{1,5}"
)
_RDZV_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}|" + _VARIABLE)
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SLURM_PARTITION = re.compile(r"[A-Za-z0-9_.\-]{1,64}(,[A-Za-z0-9_.\-]{1,64})*")
_SLURM_TIME = re.compile(r"([0-9]{1,4}-)?[0-9]{1,4}(:[0-9]{1,2}){0,2}")
DEFAULT_PORT = 29500


def _count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RecipeError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _match(name: str, pattern: re.Pattern[str], value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RecipeError(f"{name} {value!r} is not {what}")
    return value


def _nproc(value: int | str) -> str:
    if isinstance(value, str) and value in _NPROC_WORDS:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # from a command line
    return str(_count("nproc_per_node", value, 1, 4096))


def _nnodes(value: int | str) -> str:
    text = str(_count("nnodes", value, 1, 99999)) if isinstance(value, int) else value
    return _match("nnodes", _NNODES, text, "a node count (N or MIN:MAX)")


def _endpoint(value: str) -> str:
    _match("rdzv_endpoint", _ENDPOINT, value, "HOST:PORT (or $VARIABLE:PORT)")
    port = int(value.rsplit(":", 1)[1])
    _count("rendezvous port", port, 1, 65535)
    return value


def _env_words(env: Mapping[str, str]) -> list[str]:
    return [f"{check_env_name(k)}={env_value(v)}" for k, v in env.items()]


def _script_words(script: str, args: Sequence[str]) -> list[str]:
    if not isinstance(script, str) or not script:
        raise RecipeError("script must be the path of the training script")
    if isinstance(args, str):
        raise RecipeError("args is a list of words (['--lr', '3e-4']), not one string")
    return [shlex.quote(script), *(shlex.quote(str(a)) for a in args)]


def torchrun_words(
    script: str,
    *,
    nproc_per_node: int | str = "gpu",
    nnodes: int | str = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    args: Sequence[str] = (),
) -> list[str]:
    """``torchrun`` and its options, shell-safe words (no environment)."""
    nproc = _nproc(nproc_per_node)
    nodes = _nnodes(nnodes)
    if nodes == "1" and rdzv_endpoint is None:
        head = ["torchrun", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        endpoint = _endpoint(rdzv_endpoint or f"$MASTER_ADDR:{DEFAULT_PORT}")
        head = [
            "torchrun",
            f"--nnodes={nodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            # Double quotes: a $VARIABLE expands on each node; the pattern allows no other
            # character the shell would act on inside them.
            f'--rdzv-endpoint="{endpoint}"',
        ]
        if rdzv_id is not None:
            rid = _match("rdzv_id", _RDZV_ID, rdzv_id, "a job id (letters, digits, _.-)")
            head.append(f'--rdzv-id="{rid}"')
    return head + _script_words(script, args)


def torchrun_command(
    env: Mapping[str, str],
    script: str = "train.py",
    *,
    nproc_per_node: int | str = "gpu",
    nnodes: int | str = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    args: Sequence[str] = (),
) -> str:
    """``NAME=value ... torchrun ... script args``: run it on every node."""
    words = _env_words(env) + torchrun_words(
        script,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        args=args,
    )
    return " ".join(words)


def slurm_script(
    env: Mapping[str, str],
    script: str = "train.py",
    *,
    nodes: int = 1,
    gpus_per_node: int = 8,
    cpus_per_task: int | None = None,
    job_name: str = "gpudiag-train",
    partition: str | None = None,
    time: str | None = None,
    port: int = DEFAULT_PORT,
    args: Sequence[str] = (),
    comment: str = "",
) -> str:
    """An ``sbatch`` script: one task per node, each a ``torchrun`` starting ``gpus_per_node``
    ranks, the first node as the c10d rendezvous host, the recipe's variables exported."""
    n = _count("nodes", nodes, 1, 99999)
    g = _count("gpus_per_node", gpus_per_node, 1, 1024)
    _count("port", port, 1, 65535)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={_match('job_name', _SLURM_NAME, job_name, 'a SLURM job name')}",
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={g}",
    ]
    if cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={_count('cpus_per_task', cpus_per_task, 1, 4096)}")
    if partition is not None:
        lines.append(
            f"#SBATCH --partition={_match('partition', _SLURM_PARTITION, partition, 'a partition')}"
        )
    if time is not None:
        lines.append(
            f"#SBATCH --time={_match('time', _SLURM_TIME, time, 'a SLURM time ([D-]HH:MM:SS)')}"
        )
    lines.append("")
    # Comment lines: one per input line, so a line break cannot end the comment.
    lines += [f"# {line}" for line in comment.splitlines() if line.strip()]
    lines += ["set -euo pipefail", ""]
    exported = [f"export {word}" for word in _env_words(env)]
    if exported:
        lines += ["# Environment from the gpudiag recipe", *exported, ""]
    lines += [
        "# The first node of the allocation hosts the rendezvous.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        f"export MASTER_PORT={port}",
        "",
        " ".join(
            [
                "srun",
                *torchrun_words(
                    script,
                    nproc_per_node=g,
                    nnodes=n,
                    rdzv_endpoint=f"$MASTER_ADDR:{port}",
                    rdzv_id="$SLURM_JOB_ID",
                    args=args,
                ),
            ]
        ),
    ]
    return "\n".join(lines) + "\n"
