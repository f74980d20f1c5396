"""Progress of long waits: measurements report to a callback; one bar type shows it.

Measurements (profiling, batch scaling, comparisons, benchmarks) take an optional
``on_progress`` callback and call it with a :class:`Progress` after each unit of work, and with
``finished=True`` when the run is over, early verdicts included. They never import a
front end. :class:`ProgressBar` is that callback as a ``tqdm.auto`` bar (a widget bar in a
notebook, a text bar in a terminal), imported only when a bar is really shown: one bar per
stage, closed complete (green in a notebook) when its stage ends normally and left where it
stopped when the run failed. ``TQDM_DISABLE=1`` (or ``true``/``yes``) turns every bar off.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    """One report: ``done`` of ``total`` units of ``stage`` (``finished``: the run is over)."""

    stage: str
    done: int = 0
    total: int = 0
    note: str = ""
    finished: bool = False
    # What ``done`` counts, when not steps or rounds: "s" seconds waited, "B" bytes read (the
    # bar scales them to kB/MB/GB itself, so a file under a megabyte still shows its progress).
    unit: str = ""


ProgressFn = Callable[[Progress], None]


def report(
    on_progress: ProgressFn | None,
    stage: str,
    done: int,
    total: int,
    note: str = "",
    *,
    unit: str = "",
) -> None:
    """Call ``on_progress`` (when there is one) with ``done`` of ``total`` for ``stage``."""
    if on_progress is not None:
        on_progress(Progress(stage, done, total, note, unit=unit))


def finish(on_progress: ProgressFn | None, stage: str) -> None:
    """Tell ``on_progress`` the run is over (its verdict may come before ``total``)."""
    if on_progress is not None:
        on_progress(Progress(stage, finished=True))


def disabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """``TQDM_DISABLE`` set to 1/true/yes/on (tqdm's own switch, honoured for every bar)."""
    value = (os.environ if environ is None else environ).get("TQDM_DISABLE", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


class ProgressBar:
    """A :data:`ProgressFn` that draws ``tqdm.auto`` bars; also a context manager.

    A new stage closes the previous stage's bar complete and opens its own. ``finished`` (or
    leaving the ``with`` block normally) closes the bar complete; leaving it by an exception
    closes it where it stopped, so a failed run does not look finished. With ``delay_s`` a
    stage's bar appears only once the stage has run that long: a quick read shows nothing.
    """

    def __init__(
        self,
        prefix: str = "gpudiag",
        *,
        enabled: bool = True,
        leave: bool = True,
        output: contextlib.AbstractContextManager[Any] | None = None,
        delay_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.prefix = prefix
        # Where a notebook bar is displayed: an ipywidgets.Output (a button's callback has no
        # cell of its own to show it in); None: where the code runs.
        self.output = output
        self.enabled = enabled and not disabled_by_env()
        self.leave = leave
        self.bar: Any = None
        self.stage: str | None = None
        self.closed_complete: list[bool] = []  # one per closed bar: was it complete?
        self.delay_s = delay_s
        self.clock = clock
        self.stage_started = 0.0

    def __call__(self, event: Progress) -> None:
        if not self.enabled:
            return
        if event.finished:
            self.close(complete=True)
            return
        if event.stage != self.stage:
            self.close(complete=True)
            self.stage = event.stage
            self.stage_started = self.clock()
        if self.bar is None:
            if self.clock() - self.stage_started < self.delay_s:
                return  # not shown yet: the stage may end before anyone waits for it
            from tqdm.auto import tqdm

            with self.output if self.output is not None else contextlib.nullcontext():
                in_bytes = {"unit_scale": True, "unit_divisor": 1024} if event.unit == "B" else {}
                self.bar = tqdm(
                    total=event.total or None,
                    desc=f"{self.prefix} {event.stage}",
                    leave=self.leave,
                    unit=event.unit or "it",
                    **in_bytes,
                )
        if event.total and self.bar.total != event.total:
            self.bar.total = event.total
        self.bar.n = min(event.done, event.total) if event.total else event.done
        if event.note:
            self.bar.set_postfix_str(event.note[:80], refresh=False)
        self.bar.refresh()

    def close(self, *, complete: bool) -> None:
        """Close the open bar, filled to its total when ``complete``."""
        bar, self.bar, self.stage = self.bar, None, None
        if bar is None:
            return
        if complete and bar.total:
            bar.n = bar.total  # drawn by close(): a refresh here drew the finished bar again
        self.closed_complete.append(bool(not bar.total or bar.n >= bar.total))
        bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(complete=exc_type is None)


def resolve(
    progress: bool | ProgressFn | None, prefix: str = "gpudiag", *, delay_s: float = 0.0
) -> ProgressFn | None:
    """The callback for a ``progress=`` argument: a callable as given, ``True`` a new bar
    (shown once a stage has run ``delay_s`` seconds)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return ProgressBar(prefix, delay_s=delay_s)
    return progress


def iterate(
    items: Iterable[T], stage: str, on_progress: ProgressFn | None, total: int | None = None
) -> Iterator[T]:
    """Yield ``items``, reporting one unit of ``stage`` after each; finished at the end."""
    if total is None:
        total = len(items) if isinstance(items, Sized) else 0
    report(on_progress, stage, 0, total)
    for done, item in enumerate(items, start=1):
        yield item
        report(on_progress, stage, done, total)
    finish(on_progress, stage)


@contextlib.contextmanager
def closed_on_error(on_progress: ProgressFn | None) -> Iterator[None]:
    """When the block raises, a :class:`ProgressBar` is closed where it stopped (not filled):
    a failed run must not look finished. Finishing a run that went well is the caller's job."""
    try:
        yield
    except BaseException:
        if isinstance(on_progress, ProgressBar):
            on_progress.close(complete=False)
        raise


class Stages:
    """A wait made of named parts of known count (a warm-up step, a measured step, an
    estimate, ...): ``stages.next("measured step")`` reports the part that starts now,
    ``stages.finish()`` that all are done. With no callback, nothing is reported."""

    def __init__(self, on_progress: ProgressFn | None, stage: str, total: int) -> None:
        self.on_progress = on_progress
        self.stage = stage
        self.total = total
        self.done = -1

    def next(self, note: str) -> None:
        """The next part begins (its note is what the bar says it is doing)."""
        self.done += 1
        self.total = max(self.total, self.done + 1)
        report(self.on_progress, self.stage, self.done, self.total, note)

    def finish(self) -> None:
        finish(self.on_progress, self.stage)


@contextlib.contextmanager
def ticking(
    on_progress: ProgressFn | None, stage: str, note: str = "", *, every_s: float = 1.0
) -> Iterator[None]:
    """Seconds waited on a block that says nothing while it runs (a job in other processes),
    reported every ``every_s`` from a background thread; finished when the block ends, a bar
    left where it stopped when it raises."""
    if on_progress is None:
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not stop.wait(every_s):
            waited = int(time.monotonic() - started)
            on_progress(Progress(stage, waited, 0, note, unit="s"))

    on_progress(Progress(stage, 0, 0, note, unit="s"))
    thread = threading.Thread(target=tick, name=f"gpudiag {stage}", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        stop.set()  # no tick after the bar is closed where it stopped
        thread.join()
        if isinstance(on_progress, ProgressBar):
            on_progress.close(complete=False)
        raise
    stop.set()
    thread.join()
    finish(on_progress, stage)
