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


class _Card(_views.Carded):
    def as_card(self) -> _views.Card:
        return _views.Card(
            "<title>",
            [
                _views.Facts([("k<", "v&")], caption="facts"),
                _views.Grid(("h",), [("<c>",)]),
                _views.Lines(["careful"], "warning", prefix="WARNING: "),
                _views.Lines(["<n>"], "note"),
            ],
            subtitle="sub'title",
        )


def test_every_card_is_drawn_by_the_one_renderer_in_order_and_escaped() -> None:
    html = _Card()._repr_html_()
    order = [html.index(s) for s in ("&lt;title&gt;", "sub&#x27;title", "facts", "k&lt;", "v&amp;")]
    order += [html.index(s) for s in ("&lt;c&gt;", "WARNING: careful", "&lt;n&gt;")]
    assert order == sorted(order)
    assert "<title>" not in html
    assert "<c>" not in html
    assert "<div style='color:#b45309'>WARNING: careful</div>" in html
    assert "<div style='opacity:.7'>&lt;n&gt;</div>" in html


def test_a_result_card_draws_without_anyone_importing_ui_first() -> None:
    code = (
        "import sys\n"
        "from gpudiag.analysis.measurement import Measurement\n"
        "assert 'gpudiag.ui' not in sys.modules\n"
        "html = Measurement((0.001, 0.002, 0.003), label='x')._repr_html_()\n"
        "print('gpudiag-card' in html, 'gpudiag.ui.card' in sys.modules,\n"
        "      'ipywidgets' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"]


def test_a_carded_result_leaves_its_html_to_the_renderer() -> None:
    """A class that says what its card holds (``as_card``) writes no HTML of its own."""
    import ast

    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if "as_card" in methods and "_repr_html_" in methods and node.name != "Carded":
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert offenders == []
