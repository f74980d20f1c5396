"""Show, check or export a recipe: show | check | env | python | torchrun FILE."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.recipe import add_arguments, render

__all__ = ["add_arguments", "run_cell"]


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    if args.action == "show" and not args.json:
        from gpudiag.recipe import Recipe

        return Recipe.load(args.file)  # displayed as its HTML card
    text, _ = render(args)
    print(text, end="")
    return None
