"""Profile the cell as a training step (%%gpudiag profile [--steps N] [--warmup N])."""

from __future__ import annotations

import argparse
from typing import Any

from gpudiag._values import arg_int
from gpudiag.errors import GpuDiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps", type=arg_int(1, 10_000), default=5, help="profiled runs of the cell (5)"
    )
    parser.add_argument(
        "--warmup",
        type=arg_int(0, 10_000),
        default=1,
        help="runs profiled but not kept, before them (1)",
    )
    parser.add_argument(
        "--wait", type=arg_int(0, 10_000), default=0, help="runs not profiled at all, first (0)"
    )
    parser.add_argument(
        "--trace-dir", default=None, help="where the trace is saved (./gpudiag_traces)"
    )
    parser.add_argument("--no-stack", action="store_true", help="do not record Python stacks")


def _compile(cell: str, shell: Any) -> Any:
    """The cell as a code object: IPython syntax transformed, registered for tracebacks."""
    source = shell.transform_cell(cell) if hasattr(shell, "transform_cell") else cell
    filename = "<gpudiag profile cell>"
    cache = getattr(getattr(shell, "compile", None), "cache", None)
    if callable(cache):
        try:
            filename = cache(source)
        except Exception:  # an older IPython without the cache: tracebacks lose the source
            filename = "<gpudiag profile cell>"
    from gpudiag.magics.compare import compile_cell

    return compile_cell(source, filename)


def run(args: argparse.Namespace, cell: str | None, shell: Any) -> Any:
    if cell is None or not cell.strip():
        raise GpuDiagError(
            "profile is a cell magic: put %%gpudiag profile on the first line of a cell whose "
            "body is one training step (it runs wait + warmup + steps times)."
        )
    code = _compile(cell, shell)
    namespace = shell.user_ns

    def notebook_cell() -> None:
        exec(code, namespace)  # the user's own cell, in their namespace, as IPython would

    from gpudiag._progress import ProgressBar
    from gpudiag.profiling import profile

    # The cell runs wait + warmup + steps times: a slow step is a long wait.
    with ProgressBar() as bar:
        return profile(
            notebook_cell,
            steps=args.steps,
            warmup=args.warmup,
            wait=args.wait,
            trace_dir=args.trace_dir,
            with_stack=not args.no_stack,
            on_progress=bar,
        )
