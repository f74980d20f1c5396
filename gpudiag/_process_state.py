"""The process-wide state a user's code can change in passing: working directory, ``sys.argv``,
environment variables. Captured before a trial runs the user's code and put back after it.

A step that ``os.chdir``-s somewhere and then fails would otherwise leave the notebook there;
one that edits ``sys.argv`` or ``os.environ`` would leak it into every later cell. torch's own
lazy imports set variables too (``import torch._dynamo`` sets ``TORCHINDUCTOR_CACHE_DIR``):
they are put back as well, so "the state is what it was" holds to the letter.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass
class ProcessState:
    """Working directory, ``sys.argv`` (the list object and its contents) and the environment."""

    cwd: str | None
    argv_list: list[str]
    argv: list[str]
    environ: dict[str, str] | None

    @classmethod
    def capture(cls, *, env: bool = True) -> ProcessState:
        try:
            cwd: str | None = os.getcwd()
        except OSError:  # the current folder was deleted under us: nothing to go back to
            cwd = None
        return cls(
            cwd=cwd,
            argv_list=sys.argv,
            argv=list(sys.argv),
            environ=dict(os.environ) if env else None,
        )

    def restore(self) -> None:
        """Put everything back; an error only when the working directory is gone."""
        if sys.argv is not self.argv_list:
            sys.argv = self.argv_list
        if sys.argv != self.argv:
            sys.argv[:] = self.argv
        if self.environ is not None and dict(os.environ) != self.environ:
            for key in set(os.environ) - set(self.environ):
                del os.environ[key]
            for key, value in self.environ.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
        if self.cwd is not None and _cwd() != self.cwd:
            os.chdir(self.cwd)  # OSError when it was removed meanwhile: the caller reports it

    def differences(self, other: ProcessState) -> list[str]:
        out = []
        if self.cwd is not None and other.cwd != self.cwd:
            out.append(f"working directory: {self.cwd} -> {other.cwd}")
        if other.argv_list is not self.argv_list or other.argv != self.argv:
            out.append(f"sys.argv: {self.argv} -> {other.argv}")
        if self.environ is not None and other.environ != self.environ:
            changed = sorted(set(self.environ.items()) ^ set((other.environ or {}).items()))
            out.append(f"environment variables changed: {sorted({k for k, _ in changed})}")
        return out


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


__all__ = ["ProcessState"]
