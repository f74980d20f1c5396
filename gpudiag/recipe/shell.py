"""Environment words a recipe exports to a shell: safe variable names, quoted values.

Shared by the recipe (``to_env``) and its launch lines (``torchrun``, SLURM), so that every
exported line is checked the same way.
"""

from __future__ import annotations

import re
import shlex

from gpudiag.errors import RecipeError

# POSIX shell variable names (IEEE Std 1003.1, "Name"); fullmatch, since "$" alone would let
# a name with a trailing newline through and inject a line into an exported script.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def check_env_name(name: str) -> str:
    """``name`` if it is a safe environment variable name, else RecipeError."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise RecipeError(
            f"{name!r} is not an environment variable name gpudiag exports: capitals, digits and "
            "underscores, not starting with a digit ([A-Z_][A-Z0-9_]*)"
        )
    return name


def env_value(value: str) -> str:
    """``value`` quoted for a POSIX shell; RecipeError for a NUL or a line break, which no
    environment variable of a launch needs and which would split an exported line."""
    if not isinstance(value, str) or any(c in value for c in "\0\n\r"):
        raise RecipeError(
            f"environment value {value!r} holds a NUL or a line break: refused in exports"
        )
    return shlex.quote(value)


__all__ = ["ENV_NAME", "check_env_name", "env_value"]
