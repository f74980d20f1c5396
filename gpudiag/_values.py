"""Values that cross a border (a file, a command line, the environment): checked once, here.

A number a user wrote reaches gpudiag as text (a command line, an environment variable, a
nccl-tests log) or as a value decoded from a file (JSON, YAML, a Hugging Face config). Each
helper turns it into a Python number or raises one gpudiag error that names the field and the
accepted range. Digits are ASCII only: ``str.isdigit()`` accepts ``'²'``, which ``int()``
refuses, and ``int()`` accepts ``'٣'`` (Arabic-Indic three), which no tool that writes these
files produces; both are refused rather than guessed. Non-finite numbers (``NaN``,
``Infinity``, ``1e400``) and numbers beyond the field's range are refused before they reach
arithmetic that would raise ``OverflowError`` or loop for ever. Nesting is measured without
recursion, so a 100,000-deep list is refused, not a ``RecursionError``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpudiag.errors import ArgumentError, GpuDiagError

ErrorType = type[GpuDiagError]

# Optional sign, ASCII digits; surrounding blanks are tolerated (a value read from a file).
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
# A decimal number in ASCII: 12, -3.5, 1e-3, .5 (no nan/inf words, no underscores).
_FLOAT_TEXT = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
# Nesting that user data (a config, a snapshot, a recipe) never needs.
MAX_DEPTH = 64
# Whole numbers beyond this are not a size, a count or an index of anything gpudiag models
# (2**63: what a C long holds); refusing them keeps big-integer arithmetic out of loops.
MAX_WHOLE = 2**63 - 1


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _range_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"from {_num(low)} to {_num(high)}"
    if low is not None:
        return f"of at least {_num(low)}"
    if high is not None:
        return f"of at most {_num(high)}"
    return "in range"


def digits(text: str) -> bool:
    """``text`` is one or more ASCII digits and nothing else (``str.isdigit`` also accepts
    ``'²'`` and ``'٣'``; this does not)."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


def is_ascii_int(text: str) -> bool:
    """``text`` is a whole number written in ASCII digits (an optional sign and blanks)."""
    return isinstance(text, str) and _INT_TEXT.fullmatch(text) is not None


def is_ascii_number(text: str) -> bool:
    """``text`` is a decimal number in ASCII (``12``, ``-3.5``, ``1e-3``; no ``nan``/``inf``)."""
    return isinstance(text, str) and _FLOAT_TEXT.fullmatch(text) is not None


def whole_number(
    value: Any,
    field: str,
    *,
    low: int | None = None,
    high: int | None = None,
    error: ErrorType = ArgumentError,
) -> int:
    """``value`` as an int in ``[low, high]``: an int (not a bool), ASCII-digit text, or a
    float that is a finite whole number (``2.0`` from a JSON file); else ``error`` naming
    ``field`` and the range."""
    what = f"{field} must be a whole number {_range_text(low, high)}"
    if isinstance(value, bool):
        raise error(f"{what}, got {value!r} (a true/false value)")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise error(f"{what}, got {value!r}")
        if abs(value) > MAX_WHOLE:
            raise error(f"{what}, got {value:g}")
        number = int(value)
    elif isinstance(value, str):
        if not is_ascii_int(value):
            raise error(f"{what} written in ASCII digits, got {value[:40]!r}")
        if len(value.strip().lstrip("+-")) > 19:
            raise error(f"{what}, got {value.strip()[:40]}")
        number = int(value)
    else:
        raise error(f"{what}, got {_short(value)}")
    if abs(number) > MAX_WHOLE:
        raise error(f"{what}, got a number of {len(str(abs(number)))} digits")
    if (low is not None and number < low) or (high is not None and number > high):
        raise error(f"{what}, got {number}")
    return number


def finite_number(
    value: Any,
    field: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    error: ErrorType = ArgumentError,
) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``):
    an int, a float, or ASCII decimal text; never NaN or an infinity."""
    above = "above" if low_open else "from"
    if low is not None and high is not None:
        span = f"{above} {_num(low)} to {_num(high)}"
    elif low is not None:
        span = f"{'above' if low_open else 'of at least'} {_num(low)}"
    else:
        span = _range_text(None, high)
    what = f"{field} must be a finite number {span}"
    if isinstance(value, bool):
        raise error(f"{what}, got {value!r} (a true/false value)")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            raise error(f"{what}, got an integer of {len(str(value))} digits") from None
    elif isinstance(value, str):
        if not _FLOAT_TEXT.fullmatch(value):
            raise error(f"{what} written in ASCII digits, got {value[:40]!r}")
        number = float(value)
    else:
        raise error(f"{what}, got {_short(value)}")
    if not math.isfinite(number):
        raise error(f"{what}, got {value!r}")
    if low is not None and (number <= low if low_open else number < low):
        raise error(f"{what}, got {number:g}")
    if high is not None and number > high:
        raise error(f"{what}, got {number:g}")
    return number


def nesting_problem(data: Any, limit: int = MAX_DEPTH, max_nodes: int | None = None) -> str:
    """Why ``data`` (lists, tuples, dicts) is too deep or too big; "" when it is not.
    Iterative: a 100,000-deep list costs no stack."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            return f"holds more than {max_nodes} values"
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return f"nests lists or mappings more than {limit} deep"
        stack.extend((child, depth + 1) for child in children)
    return ""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(
    text: str | bytes, what: str, *, limit: int = MAX_DEPTH, error: ErrorType = GpuDiagError
) -> Any:
    """JSON from ``text`` with ``NaN`` / ``Infinity`` refused (they are not JSON) and nesting
    deeper than ``limit`` refused; every failure is ``error`` naming ``what``."""
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # JSONDecodeError and the constants refused above
        raise error(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit
        raise error(f"{what} nests lists or mappings more than {limit} deep") from None
    problem = nesting_problem(data, limit)
    if problem:
        raise error(f"{what} {problem}")
    return data


def _short(value: Any) -> str:
    """A value as an error message shows it: containers by their kind, others by repr."""
    if isinstance(value, (list, dict, tuple, set)):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- argparse types: the same checks for command-line options ---------------------------------
def arg_int(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number in ASCII digits within ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            return whole_number(text, "the value", low=low, high=high)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("the value ", "", 1)) from None

    parse.__name__ = "whole number"  # argparse names the type in its messages
    return parse


def arg_float(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in ASCII within the range."""

    def parse(text: str) -> float:
        try:
            return finite_number(text, "the value", low=low, high=high, low_open=low_open)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("the value ", "", 1)) from None

    parse.__name__ = "number"
    return parse


__all__ = [
    "MAX_DEPTH",
    "MAX_WHOLE",
    "arg_float",
    "arg_int",
    "digits",
    "finite_number",
    "is_ascii_int",
    "is_ascii_number",
    "load_json",
    "nesting_problem",
    "whole_number",
]
