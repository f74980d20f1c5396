"""A bounded ring of timestamped rows: the monitor's memory stays constant however long it runs."""

from __future__ import annotations

import threading

import numpy as np

from gpudiag.errors import ArgumentError


class SeriesRing:
    """``capacity`` rows of ``width`` float64 values plus a timestamp each.

    Every appended row gets a sequence number (0, 1, 2, ...); ``since(seq)`` returns the
    rows from ``seq`` on that are still held, which is how a widget asks for "only the new
    points". Appends and reads may come from different threads.
    """

    def __init__(self, capacity: int, width: int) -> None:
        if capacity < 1:
            raise ArgumentError("capacity must be at least 1")
        self.capacity = int(capacity)
        self.width = int(width)
        self._t = np.zeros(self.capacity, dtype=np.float64)
        self._v = np.full((self.capacity, self.width), np.nan, dtype=np.float64)
        self._count = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Rows appended so far (the sequence number the next row gets)."""
        return self._count

    @property
    def oldest(self) -> int:
        """Sequence number of the oldest row still held."""
        return max(0, self._count - self.capacity)

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    @property
    def nbytes(self) -> int:
        return int(self._t.nbytes + self._v.nbytes)

    def append(self, t: float, row: np.ndarray) -> int:
        """Store one row; returns its sequence number."""
        with self._lock:
            slot = self._count % self.capacity
            self._t[slot] = t
            self._v[slot] = row
            seq = self._count
            self._count += 1
            return seq

    def _take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.arange(start, stop) % self.capacity
        return self._t[idx].copy(), self._v[idx].copy()

    def since(self, seq: int, limit: int | None = None) -> tuple[int, np.ndarray, np.ndarray]:
        """Rows with sequence number >= ``seq`` still held: (first seq, times, values).

        With ``limit``, only the newest ``limit`` of them. Rows already overwritten are
        skipped, so the first seq returned can be larger than ``seq``.
        """
        with self._lock:
            start = max(seq, self.oldest)
            if limit is not None:
                start = max(start, self._count - limit)
            start = min(start, self._count)
            t, v = self._take(start, self._count)
            return start, t, v

    def last(self, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The newest ``n`` rows (all held rows when ``n`` is None), oldest first."""
        with self._lock:
            held = min(self._count, self.capacity)
            n = held if n is None else max(0, min(n, held))
            return self._take(self._count - n, self._count)

    def latest(self) -> tuple[float, np.ndarray] | None:
        with self._lock:
            if self._count == 0:
                return None
            slot = (self._count - 1) % self.capacity
            return float(self._t[slot]), self._v[slot].copy()


__all__ = ["SeriesRing"]
