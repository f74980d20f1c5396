"""The one fake clock of the test suite: time passes only when a test says so.

A test moves it by hand (``advance``), or lets a seeded fake workload take a random but
reproducible time (``work``); ``log`` records reads, syncs and work in order, so a timing
test can check what was measured.
"""

from __future__ import annotations

import random


class FakeClock:
    """A monotonic clock (call it for the time in seconds) that moves only when told to."""

    def __init__(self, start: float = 0.0, *, seed: int = 0) -> None:
        self.now = start
        self.rng = random.Random(seed)
        self.log: list[str] = []

    def __call__(self) -> float:
        self.log.append("read")
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sync(self) -> None:
        """A device synchronize: takes no time, only logged."""
        self.log.append("sync")

    def work(self) -> None:
        """One call of a fake workload: 1, 2, 3, 5 or 8 ms, drawn from the seeded generator."""
        self.log.append("work")
        self.now += self.rng.choice((1, 2, 3, 5, 8)) * 1e-3
