"""Results reach their figures and widgets through the view registry, never by importing the
presentation layer themselves (import-linter checks imports; this checks importlib too)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag import _views

PACKAGE = Path(gd.__file__).parent
PRESENTATION = ("plots", "ui", "magics", "cli")


def test_no_domain_module_names_the_presentation_layer() -> None:
    named = re.compile(r"""["']gpudiag\.(plots|ui|magics|cli)\b""")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in PRESENTATION
        and path.name not in {"__init__.py", "__main__.py"}
        and named.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_a_result_plots_without_anyone_importing_plots_first() -> None:
    code = (
        "import sys\n"
        "from gpudiag.bench.gemm import MatmulResult\n"
        "assert 'gpudiag.plots' not in sys.modules\n"
        "fig = MatmulResult(device='cpu', rows=()).plot()\n"
        "print(type(fig).__name__, 'gpudiag.plots.bench' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Figure", "True"]


class _Result:
    pass


class _Subclass(_Result):
    pass


@pytest.fixture
def registered_result():
    name = _views.type_name(_Result)
    _views.register("figure", name, lambda result, *args: ("drawn", type(result).__name__, args))
    yield
    _views._views.pop(("figure", name), None)


@pytest.mark.usefixtures("registered_result")
def test_the_builder_gets_the_result_and_its_arguments_and_serves_subclasses() -> None:
    assert _views.build("figure", _Result(), 1, 2) == ("drawn", "_Result", (1, 2))
    assert _views.build("figure", _Subclass()) == ("drawn", "_Subclass", ())


def test_a_result_with_no_view_says_what_to_import() -> None:
    with pytest.raises(gd.ViewError, match=r"no widget is registered for .*_Result: import"):
        _views.build("widget", _Result())
