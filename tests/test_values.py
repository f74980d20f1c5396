"""gpudiag._values: numbers at a border are ASCII, finite and in range, or a clear error."""

from __future__ import annotations

import argparse
import math

import pytest

from gpudiag._values import (
    arg_float,
    arg_int,
    digits,
    finite_number,
    is_ascii_int,
    is_ascii_number,
    load_json,
    nesting_problem,
    whole_number,
)
from gpudiag.errors import ArgumentError, GpuDiagError, PlanError


@pytest.mark.parametrize(
    ("value", "expected"),
    [("12", 12), (" 7 ", 7), ("+3", 3), (2.0, 2), (5, 5), ("0012", 12)],
)
def test_whole_numbers_that_are_accepted(value: object, expected: int) -> None:
    assert whole_number(value, "n", low=0) == expected


@pytest.mark.parametrize(
    "value",
    ["²", "٣", "\uff11\uff12", "1e3", "abc", "", 2.5, math.nan, math.inf, -math.inf, True,
     [1], {"a": 1}, None, 10**30, "9" * 30, -1],
)  # fmt: skip
def test_whole_numbers_that_are_refused_name_the_field_and_range(value: object) -> None:
    with pytest.raises(PlanError, match=r"layers must be a whole number from 1 to 100") as info:
        whole_number(value, "layers", low=1, high=100, error=PlanError)
    assert isinstance(info.value, GpuDiagError)


def test_unicode_digits_are_not_digits_here() -> None:
    # str.isdigit() says yes to all three; int() refuses the first and takes the others.
    for text in ("²", "٣", "\uff11"):
        assert text.isdigit()
        assert not digits(text)
        assert not is_ascii_int(text)
    assert digits("042")
    assert not digits("-4")
    assert is_ascii_int("-4")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", math.nan, math.inf, 10**400, "²"])
def test_non_finite_numbers_are_refused(value: object) -> None:
    with pytest.raises(ArgumentError, match="finite number"):
        finite_number(value, "mfu", low=0, high=1, low_open=True)


def test_finite_numbers_and_open_bounds() -> None:
    assert finite_number("1e-3", "x", low=0, low_open=True) == 0.001
    assert finite_number(1, "x", low=0, high=1) == 1.0
    with pytest.raises(ArgumentError, match="above 0"):
        finite_number(0, "x", low=0, low_open=True)
    assert is_ascii_number("-3.5e2")
    assert not is_ascii_number("nan")


def test_nesting_is_measured_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert "more than 64 deep" in nesting_problem({"a": deep})
    assert nesting_problem({"a": [1, {"b": [2]}]}) == ""
    assert "more than 10 values" in nesting_problem(list(range(20)), max_nodes=10)


def test_json_refuses_nan_deep_nesting_and_bad_bytes() -> None:
    assert load_json('{"a": [1, 2]}', "config") == {"a": [1, 2]}
    with pytest.raises(GpuDiagError, match="NaN is not a JSON number"):
        load_json('{"a": NaN}', "config")
    with pytest.raises(GpuDiagError, match="Infinity"):
        load_json('{"a": -Infinity}', "config")
    with pytest.raises(GpuDiagError, match="more than 64 deep"):
        load_json("[" * 100_000 + "]" * 100_000, "config")
    with pytest.raises(GpuDiagError, match="more than 64 deep"):
        load_json("[" * 100 + "]" * 100, "config")
    with pytest.raises(GpuDiagError, match="not UTF-8"):
        load_json(b"\xff\xfe{", "config")
    with pytest.raises(GpuDiagError, match="not valid JSON"):
        load_json('{"a": ', "config")


def test_argparse_types_say_what_they_take() -> None:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    parser.add_argument("--n", type=arg_int(1, 8))
    parser.add_argument("--f", type=arg_float(0, 1, low_open=True))
    assert parser.parse_args(["--n", "8", "--f", "0.5"]).n == 8
    for argv in (["--n", "٣"], ["--n", "9"], ["--f", "nan"], ["--f", "0"], ["--n", "1e1"]):
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args(argv)
