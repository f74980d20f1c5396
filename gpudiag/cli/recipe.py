"""Show, check or export a recipe: show | check | env | python | torchrun | slurm FILE."""

from __future__ import annotations

from gpudiag.commands.recipe import add_arguments, run

__all__ = ["add_arguments", "run"]
