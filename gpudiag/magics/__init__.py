"""IPython magics: ``%gpudiag <subcommand>`` and ``%%gpudiag <subcommand>``, one module each.

A subcommand module under ``gpudiag.magics`` has a one-line docstring (its help),
``add_arguments(parser)`` and ``run(args, cell, shell)``; what ``run`` returns is displayed.
Adding a subcommand is adding a module and its name to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from types import ModuleType
from typing import Any

from gpudiag.commands import canonical
from gpudiag.errors import GpuDiagError

SUBCOMMANDS: tuple[str, ...] = (
    "inspect",
    "monitor",
    "stop",
    "profile",
    "occupancy",
    "bench",
    "compare",
    "doctor",
    "recipe",
    "memory",
    "plan",
    "tune",
)


RESTORED = (
    "the notebook's models, optimizers and variables, torch's switches, the working directory, "
    "sys.argv and the environment were restored"
)


class _ParserExit(Exception):
    """argparse wanted to exit (``--help`` or a usage error); the message is already shown."""


class _Parser(argparse.ArgumentParser):
    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            print(message.rstrip())
        raise _ParserExit(status)

    def error(self, message: str) -> Any:
        self.print_usage()
        print(f"%gpudiag {self.prog.split()[-1]}: {message}")
        raise _ParserExit(2)


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"gpudiag.magics.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"gpudiag.magics.{name}":
            return None
        raise


def available() -> dict[str, ModuleType]:
    return {n: m for n in SUBCOMMANDS if (m := _module(n)) is not None}


def plain(text: str) -> str:
    """Docstring text as a person reads it: RST ``literals`` and `refs` lose their backticks."""
    return re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)


def summary_line(doc: str | None, width: int = 100) -> str:
    """The first paragraph of a docstring as one line, whole sentences only: a parenthesis
    that would make it longer than ``width`` is left out rather than cut in the middle."""
    paragraph = " ".join(plain((doc or "").strip()).split("\n\n")[0].split())
    while len(paragraph) > width:
        shorter = re.sub(r"\s*\([^()]*\)(?=[^()]*$)", "", paragraph, count=1)
        if shorter == paragraph:
            break
        paragraph = shorter
    return paragraph


def help_text() -> str:
    lines = ["%gpudiag SUBCOMMAND [options]   (or %%gpudiag SUBCOMMAND for a cell)", ""]
    for name, module in available().items():
        lines.append(f"  {name:<10} {summary_line(module.__doc__)}")
    lines += ["", "%gpudiag help SUBCOMMAND (or SUBCOMMAND --help) explains one subcommand."]
    return "\n".join(lines)


def dispatch(line: str, cell: str | None, shell: Any) -> Any:
    """Run one magic invocation; errors a user can cause are printed, never raised."""
    words = shlex.split(line)
    if not words or words[0] in {"help", "-h", "--help"}:
        if len(words) > 1:
            words = [words[1], "--help"]
        else:
            print(help_text())
            return None
    name, rest = canonical(words[0]), words[1:]
    module = _module(name) if name in SUBCOMMANDS else None
    if module is None:
        print(f"%gpudiag: unknown subcommand {name!r}.\n\n{help_text()}")
        return None
    doc = plain((module.__doc__ or name).strip())
    parser = _Parser(prog=f"%gpudiag {name}", description=doc)
    module.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except _ParserExit:
        return None
    try:
        return module.run(args, cell, shell)
    except GpuDiagError as exc:
        print(f"gpudiag: {exc}")
        return None
    except SystemExit as exc:  # never out of a magic: it would end the cell's kernel session
        print(f"gpudiag: {name} stopped: sys.exit({exc.code!r}) was called; {RESTORED}")
        return None
    except KeyboardInterrupt:
        # Reported as what it is, and raised again so that "Run all" stops here too.
        print(f"gpudiag: {name} interrupted (KeyboardInterrupt); {RESTORED}")
        raise


def load_ipython_extension(ipython: Any) -> None:
    from gpudiag.magics._register import register

    register(ipython, dispatch, help_text())


def unload_ipython_extension(ipython: Any) -> None:
    from gpudiag.magics._register import unregister

    unregister(ipython)
