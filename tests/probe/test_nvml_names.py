"""Every NVML name gpudiag uses, and every function the fake bindings implement, exists in the
installed nvidia-ml-py. gpudiag calls NVML by name through one chokepoint that reads a missing
function as "the driver is older than the bindings", so a misspelt name would be a silent N/A
on every real machine, and mypy cannot see it (pynvml is untyped)."""

from __future__ import annotations

import ast
import ctypes
import re

import pynvml

from tests.conftest import REPO
from tests.fakes.fake_nvml import FakeNvml

# An NVML identifier, used as an attribute (``nvml.NVML_...``) or as the name string the
# chokepoint calls (``s.call("nvmlDeviceGetName", h)``); prose in docstrings does not count.
# Prefixes that code completes at run time ("NVML_ERROR_" + name) end in "_", checked apart.
NAME = re.compile(r"nvml[A-Z]\w*|NVML_[A-Z0-9_]*[A-Z0-9]|c_nvml\w+|NVMLError_\w+")
PREFIX = re.compile(r"NVML_[A-Z0-9_]+_")


def _identifiers() -> list[tuple[str, str]]:
    found = []
    for path in sorted((REPO / "gpudiag").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                found.append((node.attr, str(path.relative_to(REPO))))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((node.value, str(path.relative_to(REPO))))
    return found


def _struct_fields() -> set[str]:
    """Field names of the bindings' ctypes structs (``metric.nvmlReturn``)."""
    fields: set[str] = set()
    for value in vars(pynvml).values():
        if isinstance(value, type) and issubclass(value, ctypes.Structure):
            fields.update(name for name, *_ in getattr(value, "_fields_", ()))
    return fields


def _used() -> dict[str, str]:
    used: dict[str, str] = {}
    for name, where in _identifiers():
        if NAME.fullmatch(name):
            used.setdefault(name, where)
    return used


def test_every_nvml_name_gpudiag_uses_exists_in_nvidia_ml_py() -> None:
    used = _used()
    assert len(used) > 60  # the scan found the probe's calls
    fields = _struct_fields()
    missing = {
        name: where
        for name, where in used.items()
        if not hasattr(pynvml, name) and name not in fields
    }
    assert not missing


def test_every_prefix_gpudiag_completes_names_real_constants() -> None:
    prefixes = [(name, where) for name, where in _identifiers() if PREFIX.fullmatch(name)]
    assert prefixes
    for prefix, where in prefixes:
        assert any(name.startswith(prefix) for name in dir(pynvml)), (where, prefix)


def test_every_function_the_fake_implements_is_a_real_binding() -> None:
    implemented = [name[1:] for name in dir(FakeNvml) if name.startswith("_nvml")]
    assert len(implemented) > 30
    assert [name for name in implemented if not callable(getattr(pynvml, name, None))] == []
