"""Registers the ``gpudiag`` line/cell magic with an IPython shell."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class

# (line, cell, shell) -> what the magic shows; handed in by gpudiag.magics (no import back).
Dispatch = Callable[[str, "str | None", Any], Any]


def register(ipython: Any, dispatch: Dispatch, help_text: str) -> None:
    @magics_class
    class GpuDiagMagics(Magics):
        @line_cell_magic
        def gpudiag(self, line: str = "", cell: str | None = None) -> Any:
            return dispatch(line, cell, self.shell)

    # ``%gpudiag?`` shows the list of subcommands.
    GpuDiagMagics.gpudiag.__doc__ = help_text
    ipython.register_magics(GpuDiagMagics(ipython))
    from gpudiag.ui.figures import register_displays

    register_displays(ipython)


def unregister(ipython: Any) -> None:
    ipython.magics_manager.registry.pop("GpuDiagMagics", None)
    from gpudiag.ui.figures import unregister_displays

    unregister_displays(ipython)
