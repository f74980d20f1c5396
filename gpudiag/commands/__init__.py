"""The one command table: every ``gpudiag NAME`` and ``%gpudiag NAME``, defined once.

``gpudiag.cli`` (the terminal) and ``gpudiag.magics`` (the notebook) are two thin front ends
that read ``TABLE`` and never import each other. A row names the module that serves each
front end, by its import path, so reading the table imports none of them:

- the terminal's module has a one-line docstring (the help), ``add_arguments(parser)`` and
  ``run(args) -> int`` (the exit status);
- the notebook's module has the docstring, ``add_arguments(parser)`` and
  ``run_cell(args, cell, shell)``, whose return value the notebook displays.

Most commands are one module here serving both; a module under ``cli/`` or ``magics/`` is
named only where a front end adds something of its own (the terminal's redraws, a notebook
cell run as the workload, widgets). A new command is a module in this package and its row.
"""

from __future__ import annotations

from dataclasses import dataclass

_HERE = "gpudiag.commands."


@dataclass(frozen=True)
class Command:
    """One row of the table: a command's one name, its other spellings, and its modules."""

    name: str
    terminal: str | None = None  # module of `gpudiag NAME` (None: notebook only)
    notebook: str | None = None  # module of `%gpudiag NAME` (None: terminal only)
    aliases: tuple[str, ...] = ()
    every_rank: bool = False  # under torchrun it runs on every rank; rank 0 prints one answer


TABLE: tuple[Command, ...] = (
    Command("demo", terminal="gpudiag.cli.demo"),
    Command("inspect", _HERE + "inspect", "gpudiag.magics.inspect", every_rank=True),
    Command("monitor", "gpudiag.cli.monitor", "gpudiag.magics.monitor"),
    Command("stop", notebook="gpudiag.magics.stop"),
    Command("profile", notebook="gpudiag.magics.profile"),
    Command("trace", terminal=_HERE + "trace"),
    Command("occupancy", _HERE + "occupancy", "gpudiag.magics.occupancy"),
    Command("bench", _HERE + "bench", "gpudiag.magics.bench", every_rank=True),
    Command("compare", _HERE + "compare", "gpudiag.magics.compare"),
    # one process: gd.diagnose; under torchrun: the rank doctor (commands/doctor.py)
    Command("doctor", _HERE + "doctor", "gpudiag.magics.doctor", aliases=("diagnose",)),
    Command("recipe", _HERE + "recipe", "gpudiag.magics.recipe"),
    Command("record", terminal="gpudiag.cli.record"),
    Command("memory", _HERE + "memory", "gpudiag.magics.memory"),
    Command("plan", _HERE + "plan", "gpudiag.magics.plan"),
    Command("tune", _HERE + "tune", "gpudiag.magics.tune"),
)


def check_table(table: tuple[Command, ...]) -> dict[str, Command]:
    """Every name and alias -> its row; a spelling used twice is a ValueError (a name is
    never parsed by two commands)."""
    by_name: dict[str, Command] = {}
    for row in table:
        if row.terminal is None and row.notebook is None:
            raise ValueError(f"command {row.name!r} has no front end")
        for spelling in (row.name, *row.aliases):
            if spelling in by_name:
                raise ValueError(
                    f"{spelling!r} names both {by_name[spelling].name!r} and {row.name!r}"
                )
            by_name[spelling] = row
    return by_name


_BY_NAME = check_table(TABLE)


def find(name: str) -> Command | None:
    """The row of a name or an alias (``"diagnose"`` -> the ``doctor`` row); None if unknown."""
    return _BY_NAME.get(name)


def canonical(name: str) -> str:
    """The command's one name: ``"diagnose"`` -> ``"doctor"``."""
    row = find(name)
    return row.name if row is not None else name


def aliases_of(name: str) -> tuple[str, ...]:
    """The other spellings of a command: ``"doctor"`` -> ``("diagnose",)``."""
    row = find(name)
    return row.aliases if row is not None and row.name == name else ()


def terminal_commands() -> tuple[Command, ...]:
    """The rows of ``gpudiag NAME``, in the table's order."""
    return tuple(row for row in TABLE if row.terminal is not None)


def notebook_commands() -> tuple[Command, ...]:
    """The rows of ``%gpudiag NAME``, in the table's order."""
    return tuple(row for row in TABLE if row.notebook is not None)
