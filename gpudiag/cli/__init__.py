"""The ``gpudiag`` terminal command: one module per subcommand, loaded only when used."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from gpudiag._rank_exit import record_failure
from gpudiag.commands import aliases_of, canonical
from gpudiag.errors import GpuDiagError

# name -> module under gpudiag.cli; each module has a one-line docstring (the help text),
# ``add_arguments(parser)`` and ``run(args) -> int``. Adding a subcommand is adding a module.
COMMANDS: tuple[str, ...] = (
    "demo",
    "inspect",
    "monitor",
    "trace",
    "occupancy",
    "bench",
    "compare",
    # the `doctor` command (alias `diagnose`, gpudiag.commands.ALIASES): one process, or
    # every rank under torchrun; its module keeps the alias's name
    "diagnose",
    "recipe",
    "record",
    "memory",
    "plan",
    "tune",
)
# Under torchrun these run on every rank and rank 0 prints one merged answer.
ON_EVERY_RANK: tuple[str, ...] = ("inspect", "bench")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"gpudiag.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"gpudiag.cli.{name}":
            return None  # not built yet in this version
        if exc.name and exc.name.partition(".")[0] != "gpudiag":
            # A dependency is not installed: that subcommand says so when run, the others work.
            return _unavailable(name, exc.name.partition(".")[0])
        raise


def _unavailable(name: str, missing: str) -> ModuleType:
    """A stand-in subcommand whose run says which package to install."""
    module = ModuleType(f"gpudiag.cli.{name}")
    module.__doc__ = f"(unavailable here: needs the Python package {missing!r})"

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.set_defaults(_unavailable=True)  # main() takes any arguments, to say why

    def run(args: argparse.Namespace) -> int:
        raise GpuDiagError(
            f"`gpudiag {name}` needs the Python package {missing!r}, which is not installed "
            f"here: install gpudiag's dependencies (pip install gpudiag, or pip install {missing})"
        )

    module.add_arguments = add_arguments  # type: ignore[attr-defined]
    module.run = run  # type: ignore[attr-defined]
    return module


def build_parser() -> argparse.ArgumentParser:
    from gpudiag._version import __version__

    parser = argparse.ArgumentParser(
        prog="gpudiag",
        description="GPU diagnostics for PyTorch: inspect, monitor, profile, diagnose, fix.",
    )
    parser.add_argument("--version", action="version", version=f"gpudiag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        if module is None:
            continue
        help_text = (module.__doc__ or name).strip().splitlines()[0]
        public = canonical(name)  # the `diagnose` module is the `doctor` command
        if public != name and public in COMMANDS:
            public = name  # the other name has a module of its own: never two parsers per name
        aliases = [a for a in aliases_of(public) if a == name or a not in COMMANDS]
        p = sub.add_parser(public, aliases=aliases, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "_unavailable", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 2
    try:
        if args.command in ON_EVERY_RANK:
            from gpudiag.distributed.group import rank_env

            if rank_env() is not None:
                from gpudiag.distributed.run import on_every_rank

                return on_every_rank(module, args)
        return int(module.run(args))
    except GpuDiagError as exc:
        record_failure(exc)  # a rank under a gpudiag launcher: its own error, for the caller
        print(f"gpudiag: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpudiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gpudiag inspect --json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
