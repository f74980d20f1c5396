"""The troubleshooting notebooks run top to bottom in a real kernel (as a user would)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 3
    # The first one a newcomer opens: what gpudiag is and five things to try.
    assert NOTEBOOKS[0].name == "00-start-here.ipynb"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert errors == []
    # every code cell produced something a reader can see
    assert all(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_with_its_outputs(path: Path) -> None:
    """A person browsing the repository sees results (``make notebooks`` stores them)."""
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.get("outputs") for cell in code), "run `make notebooks`"
    assert not any(o.get("output_type") == "error" for cell in code for o in cell.outputs)
    # Stored light and portable: no live widget state, no path of the machine that ran it.
    assert "widgets" not in nb.metadata
    assert path.stat().st_size < 1 << 20
    assert str(REPO) not in path.read_text(encoding="utf-8")


_FENCE = re.compile(r"```.*?```", re.S)
_STATEMENTS = (ast.Call, ast.Assign, ast.AugAssign, ast.Import, ast.ImportFrom)


def pasted_code(text: str) -> bool:
    """Markdown that is code, not prose: once headings and fenced blocks are set aside, a line
    is an IPython magic or shell escape, or the rest parses as Python that does something (a
    call, an assignment, an import). Prose does not parse; a lone word does nothing."""
    lines = [
        line
        for line in _FENCE.sub("", text).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if any(line.lstrip().startswith(("%", "!")) for line in lines):
        return True
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return False
    return any(isinstance(node, _STATEMENTS) for node in ast.walk(tree))


def broken_promises(nb: nbformat.NotebookNode) -> list[str]:
    """Markdown that announces a cell (it ends with ':') with no code cell after it, and code
    pasted as markdown (it would never run, and a reader takes it for the output)."""
    found = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        following = cells[i + 1].cell_type if i + 1 < len(cells) else "the end"
        if cell.source.rstrip().endswith(":") and following != "code":
            found.append(f"cell {i} ends with ':' but {following} follows: {first[:60]!r}")
        if pasted_code(cell.source):
            found.append(f"cell {i} is code pasted as markdown: {first[:60]!r}")
    return found


def _notebook(*cells: tuple[str, str]) -> nbformat.NotebookNode:
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    return nbformat.v4.new_notebook(cells=[make[kind](text) for kind, text in cells])


def test_the_promise_check_finds_what_it_is_for() -> None:
    # Notebook 00 ended with a code line pasted as markdown, 04 with a promise and no cell.
    assert broken_promises(
        _notebook(("code", "x = 1"), ("markdown", "gd.bench.matmul(sizes=[1024])"))
    )
    assert broken_promises(
        _notebook(
            ("markdown", "## Two nodes\n\nThe same plan from the\nmagic:"), ("markdown", "## Next")
        )
    )
    assert broken_promises(_notebook(("markdown", "The plan from the magic:")))  # at the end
    assert broken_promises(_notebook(("markdown", "%gpudiag plan llama2-70b --gpus 16")))
    assert broken_promises(_notebook(("markdown", "import gpudiag as gd\ngd.inspect()")))
    # Prose, headings, inline code and fenced examples are not code pasted by mistake.
    fine = _notebook(
        ("markdown", "# Start here\n\n`gd.inspect()` never raises. Run the cells:"),
        ("code", "gd.inspect()"),
        ("markdown", "## Results\n\nSummary\n\n```python\nx = gd.inspect()\n```"),
        ("markdown", "One row per rank; the JSON form has a `ranks` list."),
    )
    assert broken_promises(fine) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_prose_keeps_its_promises(path: Path) -> None:
    assert broken_promises(nbformat.read(path, as_version=4)) == []
