"""The troubleshooting notebooks run top to bottom in a real kernel (as a user would)."""

from __future__ import annotations

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
