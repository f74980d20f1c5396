"""Every error a user can cause is a GpuDiagError defined in gpudiag.errors and reachable as
``gd.<Name>Error``; bad arguments raise it (still a ValueError for callers that catch that)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag import errors

PACKAGE = Path(gd.__file__).parent


def _error_classes() -> list[type[BaseException]]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]


def test_every_error_class_is_defined_in_the_errors_module() -> None:
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Warning")):
                elsewhere.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert elsewhere == []


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_is_exported_and_derives_from_the_base(cls: type[BaseException]) -> None:
    assert cls.__name__ in errors.__all__
    assert getattr(gd, cls.__name__) is cls
    assert cls.__name__ in dir(gd)
    if cls is not errors.GpuDiagWarning:
        assert issubclass(cls, gd.GpuDiagError)


def test_old_import_paths_give_the_same_classes() -> None:
    from gpudiag.fixes import FixConflictError, FixError
    from gpudiag.specs import SpecsError, UnknownComputeCapabilityError
    from gpudiag.step import WorkloadError

    assert (FixError, FixConflictError) == (gd.FixError, gd.FixConflictError)
    assert (SpecsError, UnknownComputeCapabilityError) == (
        gd.SpecsError,
        gd.UnknownComputeCapabilityError,
    )
    assert WorkloadError is gd.WorkloadError


def test_out_of_range_arguments_raise_argument_error() -> None:
    from gpudiag.analysis.stats import speedup_ci
    from gpudiag.bench.memory import pcie_bandwidth_gbps
    from gpudiag.bench.timing import Rotation
    from gpudiag.monitoring.buffer import SeriesRing

    with pytest.raises(gd.ArgumentError, match="confidence must be between 0 and 1"):
        speedup_ci([1.0, 1.1], [1.0, 1.2], confidence=1.5)
    with pytest.raises(gd.ArgumentError, match="unknown PCIe link gen 9"):
        pcie_bandwidth_gbps(9, 16)
    with pytest.raises(gd.ArgumentError, match="at least one item"):
        Rotation([])
    with pytest.raises(ValueError, match="capacity must be at least 1"):  # still a ValueError
        SeriesRing(0, 1)


def test_an_unknown_attention_implementation_is_a_workload_error() -> None:
    from gpudiag.workloads.gpt import build

    with pytest.raises(gd.WorkloadError, match="attn_implementation must be one of"):
        build(attn_implementation="bogus")


def test_a_malformed_prometheus_line_is_a_probe_error() -> None:
    from gpudiag.probe.dcgm import parse_prometheus_text

    with pytest.raises(gd.ProbeError, match="line 1"):
        parse_prometheus_text("{} 1\n")
