"""gpudiag.units: byte sizes written and read one way."""

from __future__ import annotations

import pytest

from gpudiag.units import (
    BINARY_SUFFIXES,
    CELL,
    SI_SUFFIXES,
    SIGNIFICANT,
    WAIT,
    Steps,
    format_bytes,
    format_seconds,
    parse_bytes,
)


@pytest.mark.parametrize(
    ("n", "spec", "si", "text"),
    [
        (None, ",.2f", False, "N/A"),
        (512, ",.2f", False, "512 B"),
        (1536, ",.2f", False, "1.50 KiB"),
        (-3 << 30, ",.2f", False, "-3.00 GiB"),
        (5000 << 30, ",.2f", False, "5,000.00 GiB"),
        (64 << 20, "g", False, "64 MiB"),
        (3 << 29, "g", False, "1.5 GiB"),
        (2_500_000, ".1f", True, "2.5 MB"),
        (999, ".1f", True, "999 B"),
    ],
)
def test_format_bytes(n: float | None, spec: str, si: bool, text: str) -> None:
    assert format_bytes(n, spec, si=si) == text


@pytest.mark.parametrize(
    ("n", "spec", "unit", "text"),
    [
        # a process's GPU memory (probe.processes): two decimals of GiB, whole MiB below
        (80 * (1 << 30) + 12345, ".2f", "GiB", "80.00 GiB"),
        (512, ".0f", "MiB", "0 MiB"),
        ((1 << 30) - 1, ".0f", "MiB", "1024 MiB"),
        # the system report: a GPU's memory in GiB, its use in MiB with thousands
        (3 << 29, ".1f", "GiB", "1.5 GiB"),
        (0, ".1f", "GiB", "0.0 GiB"),
        (40_000 << 20, ",.0f", "MiB", "40,000 MiB"),
        (1536, "g", "KiB", "1.5 KiB"),
    ],
)
def test_format_bytes_in_one_unit(n: float, spec: str, unit: str, text: str) -> None:
    assert format_bytes(n, spec, unit=unit) == text


# The three ways gpudiag wrote a duration, pinned to what each wrote before it moved here.
@pytest.mark.parametrize(
    ("seconds", "steps", "text"),
    [
        # a measurement's median and IQR: three significant digits, down to nanoseconds
        (0.0, SIGNIFICANT, "0 ns"),
        (5e-10, SIGNIFICANT, "0.5 ns"),
        (1.2345e-5, SIGNIFICANT, "12.3 us"),
        (9.9949e-4, SIGNIFICANT, "999 us"),
        (9.9951e-4, SIGNIFICANT, "1e+03 us"),
        (0.0123456, SIGNIFICANT, "12.3 ms"),
        (1.23456, SIGNIFICANT, "1.23 s"),
        (3600.0, SIGNIFICANT, "3.6e+03 s"),
        (-0.5, SIGNIFICANT, "-500 ms"),
        (float("nan"), SIGNIFICANT, "n/a"),
        (float("inf"), SIGNIFICANT, "n/a"),
        # a comparison's median step cell
        (None, CELL, "n/a"),
        (2e-7, CELL, "0 us"),
        (2.5e-4, CELL, "250 us"),
        (1e-3, CELL, "1.0 ms"),
        (0.99949, CELL, "999.5 ms"),
        (0.9996, CELL, "999.6 ms"),
        (1.0, CELL, "1.00 s"),
        (1.23456, CELL, "1.23 s"),
        (float("inf"), CELL, "n/a"),
        # how long an undecided arm would need: seconds, then minutes from two of them
        (0.0, WAIT, "0.0 s"),
        (9.94, WAIT, "9.9 s"),
        (9.96, WAIT, "10.0 s"),
        (59.5, WAIT, "60 s"),
        (119.6, WAIT, "120 s"),
        (120.0, WAIT, "2 min"),
        (150.0, WAIT, "2 min"),
        (3600.0, WAIT, "60 min"),
    ],
)
def test_format_seconds(seconds: float | None, steps: Steps, text: str) -> None:
    assert format_seconds(seconds, steps) == text


def test_format_seconds_says_none_its_own_way() -> None:
    assert format_seconds(None, WAIT, none="?") == "?"
    assert format_seconds(float("nan"), WAIT, none="?") == "?"


def test_format_seconds_needs_a_last_step_from_zero() -> None:
    with pytest.raises(ValueError, match="last step"):
        format_seconds(1e-3, ((1.0, 1.0, "s", ".1f"),))


def test_parse_bytes_reads_each_tables_meaning() -> None:
    assert parse_bytes("4096") == 4096
    assert parse_bytes(" 1.5MiB ") == 3 << 19
    assert parse_bytes("1MB") == 1 << 20  # nccl-tests: every suffix binary
    assert parse_bytes("2 GB", SI_SUFFIXES) == 2 * 10**9
    assert parse_bytes("2 GiB", SI_SUFFIXES) == 2 << 30
    assert parse_bytes("1T") is None  # not a buffer size nccl-tests takes
    assert "t" not in BINARY_SUFFIXES


@pytest.mark.parametrize("bad", ["", "x", "1e3", "-1", "1 KBB", "١٢", "1.5.2K"])
def test_parse_bytes_refuses_what_is_not_a_size(bad: str) -> None:
    assert parse_bytes(bad) is None
    assert parse_bytes(bad, SI_SUFFIXES) is None
