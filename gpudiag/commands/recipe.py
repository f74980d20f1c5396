"""Show, check or export a recipe: show | check | env | python | torchrun | slurm FILE."""

from __future__ import annotations

import argparse
import json

from gpudiag._values import arg_int, digits

ACTIONS = ("show", "check", "env", "python", "torchrun", "slurm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=ACTIONS, help="what to do with the recipe")
    parser.add_argument("file", help="a recipe saved by gpudiag (.yaml or .json)")
    parser.add_argument("--json", action="store_true", help="show / check as JSON")
    parser.add_argument("--script", default="train.py", help="torchrun: the training script")
    parser.add_argument("--nproc", default="gpu", help="torchrun: processes per node")
    parser.add_argument("--nnodes", default="1", help="torchrun / slurm: number of nodes")
    parser.add_argument(
        "--rdzv-endpoint", default=None, help="torchrun on several nodes: HOST:PORT"
    )
    parser.add_argument(
        "--gpus-per-node", type=arg_int(1, 1024), default=8, help="slurm: GPUs per node"
    )
    parser.add_argument("--partition", default=None, help="slurm: partition")
    parser.add_argument("--time", default=None, help="slurm: time limit ([D-]HH:MM:SS)")
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NCCL_VAR",
        help="export an NCCL variable that loads a plugin or names a file (refused by default: "
        "a recipe is data); repeat for several",
    )


def render(args: argparse.Namespace) -> tuple[str, int]:
    """(text to print, exit status) for one action; shared with the notebook magic."""
    from gpudiag.errors import RecipeError
    from gpudiag.recipe import Recipe

    recipe = Recipe.load(args.file)
    if args.action == "show":
        return (recipe.to_json() if args.json else repr(recipe) + "\n"), 0
    if args.action == "env":
        text = recipe.to_env(allow=args.allow)
        return text or "# this recipe sets no environment variables\n", 0
    if args.action == "python":
        return recipe.to_python(path=args.file, allow=args.allow), 0
    if args.action == "torchrun":
        line = recipe.torchrun_command(
            args.script,
            nproc_per_node=args.nproc,
            nnodes=int(args.nnodes) if digits(str(args.nnodes)) else args.nnodes,
            rdzv_endpoint=args.rdzv_endpoint,
            allow=args.allow,
        )
        return line + "\n", 0
    if args.action == "slurm":
        if not digits(str(args.nnodes)):
            raise RecipeError(f"--nnodes for a SLURM script is a number, got {args.nnodes!r}")
        text = recipe.slurm_script(
            args.script,
            nodes=int(args.nnodes),
            gpus_per_node=args.gpus_per_node,
            partition=args.partition,
            time=args.time,
            allow=args.allow,
        )
        return text, 0
    checks = recipe.check()
    status = 0 if all(ok for _, ok, _ in checks) else 1
    if args.json:
        rows = [{"fix": f.label, "applicable": ok, "reason": why} for f, ok, why in checks]
        return json.dumps(rows, indent=2) + "\n", status
    lines = [
        f"{'ok  ' if ok else 'SKIP'} {f.label}" + (f": {why}" if why else "")
        for f, ok, why in checks
    ]
    return ("\n".join(lines) or "the recipe has no fixes") + "\n", status


def run(args: argparse.Namespace) -> int:
    text, status = render(args)
    print(text, end="")
    return status
