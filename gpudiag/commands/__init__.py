"""What the terminal and the notebook share: a subcommand's arguments and work, defined once.

``gpudiag.cli`` (``gpudiag NAME``) and ``gpudiag.magics`` (``%gpudiag NAME``) are two thin
front ends over these modules and never import each other. A module here has a one-line
docstring (the help), ``add_arguments(parser)`` and the functions that do the work.
"""

from __future__ import annotations

# One name per command in both front ends; the other spelling stays an alias (alias -> name).
ALIASES: dict[str, str] = {"diagnose": "doctor"}


def canonical(name: str) -> str:
    """The command's one name: ``"diagnose"`` -> ``"doctor"``."""
    return ALIASES.get(name, name)


def aliases_of(name: str) -> tuple[str, ...]:
    """The other spellings of a command: ``"doctor"`` -> ``("diagnose",)``."""
    return tuple(alias for alias, target in ALIASES.items() if target == name)
