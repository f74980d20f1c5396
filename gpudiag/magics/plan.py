"""Parallel layout over N GPUs: %gpudiag plan MODEL --gpus N [--topology FILE] [--json].

``MODEL`` is a notebook variable (a config, or a module with ``.config``), a known model name
(gpt3-175b, llama3-70b, ...) or a JSON config file; ``--layers/--hidden/--heads`` describe one
without a name. Returns the ``gd.Plan`` (its table displays), or its dict with ``--json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag.commands.plan import add_arguments, compute

__all__ = ["add_arguments", "run_cell"]


def run_cell(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {}
    result = compute(args, namespace)
    return result.to_dict() if args.json else result
