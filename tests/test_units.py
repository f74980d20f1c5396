"""gpudiag.units: byte sizes written and read one way."""

from __future__ import annotations

import pytest

from gpudiag.units import BINARY_SUFFIXES, SI_SUFFIXES, format_bytes, parse_bytes


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
