"""Running a user's code (a training step, a notebook cell) with a deadline, in this process.

A step that hangs cannot be killed in-process the way a process can: there is no safe way to
stop a thread from outside. What Python does allow is raising an exception in the running code
at its next bytecode, which is what Ctrl-C does. So a deadline arms a timer (``SIGALRM`` in the
main thread, where Jupyter and scripts run their code; ``PyThreadState_SetAsyncExc`` from a
watchdog thread anywhere else) that raises ``_Expired`` in the step when its time is up, and
again every second after that, so code that swallows one (``except BaseException: pass`` in a
retry loop) still stops. ``_Expired`` derives from ``BaseException``, so ordinary ``except
Exception`` handlers in user code do not catch it; the deadline turns it into
``StepTimeoutError`` once it is out of the step. The caller's trial then restores the user's
state as after any other failure, and verifies it.

What this cannot do, said plainly: code blocked inside native code (a collective waiting for
a peer that died, a deadlocked DataLoader worker pipe, a CUDA kernel that never ends) only sees
the exception when it returns to Python. A watchdog thread then prints, once, that the step is
past its deadline and cannot be interrupted, so the user knows to interrupt or restart the
kernel instead of waiting.

``SystemExit`` raised by the user's code inside a deadline (``sys.exit()`` in a step or a
cell) becomes ``StepExitError``: a step is a function that returns, and exiting the notebook's
kernel (or the script that called gpudiag) from the middle of a trial is never what was meant.
``KeyboardInterrupt`` passes through as it is: it is the user's own Ctrl-C.

``user_code_failures`` is the same border one level up, around a whole measurement
(``gd.memory``, ``gd.fit``, ``gd.diagnose``): an exception raised in the user's own code (a
frame outside gpudiag and torch in its traceback) becomes ``StepFailedError``, which says
which measurement it stopped and keeps the original as its ``__cause__``; an exception from
gpudiag's own code is left as it is (a bug to report, not the user's).
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpudiag.errors import GpuDiagError, StepExitError, StepFailedError, StepTimeoutError

# After the first alarm, the exception is raised again this often until the step is out.
REPEAT_S = 1.0
# How long past its deadline a step may sit in native code before the user is told.
STUCK_NOTICE_S = 10.0


class _Expired(BaseException):
    """Raised inside the step when its deadline passes (a BaseException: user code's ``except
    Exception`` does not swallow it)."""


@dataclass
class _Active:
    ends_at: float
    what: str


_stack: list[_Active] = []


def _on_alarm(signum: int, frame: object) -> None:
    if _stack and time.monotonic() >= _stack[-1].ends_at - 0.05:
        raise _Expired()


def _thread_alarm(thread_id: int, done: threading.Event, seconds: float) -> None:
    if done.wait(seconds):
        return
    while not done.is_set():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread_id), ctypes.py_object(_Expired)
        )
        if done.wait(REPEAT_S):
            return


def _stuck_notice(done: threading.Event, seconds: float, what: str) -> None:
    if done.wait(seconds + STUCK_NOTICE_S):
        return
    sys.stderr.write(
        f"gpudiag: {what} has run {STUCK_NOTICE_S:.0f} s past its {seconds:g} s limit and "
        "cannot be interrupted: it is blocked in native code (a collective waiting for a peer, "
        "a DataLoader worker, a device call). Interrupt or restart the kernel; the trial "
        "restores your state when it is interrupted.\n"
    )
    sys.stderr.flush()


@contextmanager
def deadline(seconds: float | None, what: str, *, hint: str = "") -> Iterator[None]:
    """Run the block with ``seconds`` to finish; past them ``StepTimeoutError`` saying
    "{what} did not finish within N s{hint}". ``None`` or ``inf``: no limit (``SystemExit``
    is still turned into ``StepExitError``). Nested deadlines keep the earliest end."""
    limited = seconds is not None and math.isfinite(seconds) and seconds > 0
    if not limited:
        with _user_exit(what):
            yield
        return
    assert seconds is not None
    now = time.monotonic()
    ends_at = now + seconds
    if _stack:
        ends_at = min(ends_at, _stack[-1].ends_at)
    active = _Active(ends_at, what)
    done = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    use_signal = in_main and hasattr(signal, "setitimer")
    previous_handler = None
    previous_timer = (0.0, 0.0)
    if use_signal:
        previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
        previous_timer = signal.setitimer(signal.ITIMER_REAL, max(ends_at - now, 1e-3), REPEAT_S)
    else:
        threading.Thread(
            target=_thread_alarm,
            args=(threading.get_ident(), done, max(ends_at - now, 1e-3)),
            daemon=True,
        ).start()
    threading.Thread(target=_stuck_notice, args=(done, seconds, what), daemon=True).start()
    _stack.append(active)
    try:
        with _user_exit(what):
            yield
    except _Expired:
        if time.monotonic() >= active.ends_at - 0.05 and (
            len(_stack) < 2 or _stack[-2].ends_at > active.ends_at
        ):
            raise StepTimeoutError(f"{what} did not finish within {seconds:g} s{hint}") from None
        raise  # an enclosing deadline expired first: it reports itself
    finally:
        done.set()
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _stack.remove(active)
        if use_signal:
            signal.signal(signal.SIGALRM, previous_handler)
            if previous_timer[0] > 0:  # an enclosing timer (ours or the caller's) goes on
                left = previous_timer[0] - (time.monotonic() - now)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_timer[1])


@contextmanager
def _user_exit(what: str) -> Iterator[None]:
    try:
        yield
    except SystemExit as exc:
        raise StepExitError(
            f"{what} called sys.exit({exc.code!r}): a training step must return; gpudiag "
            "stopped the trial there and restored your state"
        ) from None


def _package_root(name: str) -> str | None:
    """The folder of package ``name`` (with a trailing separator), None when not installed."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations))) + os.sep


def _not_user_code() -> tuple[str, ...]:
    """Folders whose frames are never the user's: gpudiag, torch, the standard library and
    installed packages (a user's own code is a notebook cell, a script, a local module)."""
    import sysconfig

    roots = [root for root in map(_package_root, ("gpudiag", "torch")) if root]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(os.path.realpath(path) + os.sep)
    return tuple(roots)


def raised_in_user_code(exc: BaseException) -> bool:
    """Whether ``exc``'s traceback passes through the user's own code (a notebook cell, a
    script, a local module: outside gpudiag, torch, the standard library and installed
    packages)."""
    ours = _not_user_code()
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith("<frozen") and not os.path.realpath(name).startswith(ours):
            return True
        tb = tb.tb_next
    return False


@contextmanager
def user_code_failures(what: str) -> Iterator[None]:
    """Around a measurement that runs the user's code: their exception becomes
    ``StepFailedError`` naming ``what`` (the original is its ``__cause__``)."""
    try:
        yield
    except GpuDiagError:
        raise
    except Exception as exc:
        if not raised_in_user_code(exc):
            raise
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise StepFailedError(
            f"{what} stopped: the workload's own code raised {type(exc).__name__}"
            + (f": {first}" if first else "")
            + " (the full traceback is this error's __cause__; your state was restored)"
        ) from exc


__all__ = ["REPEAT_S", "deadline", "raised_in_user_code", "user_code_failures"]
