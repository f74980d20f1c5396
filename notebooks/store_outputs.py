"""Execute every troubleshooting notebook and store it with its outputs (``make notebooks``).

A person browsing the repository sees results without running anything; CI re-executes the
notebooks (tests/notebooks) and fails if one errors. What is stored is kept light and
portable: live widget state (a FigureWidget carries the whole plotly.js bundle, ~5 MB) is
dropped, so widget outputs fall back to the HTML every display also carries, and this
checkout's path is written as ``<repo>``. Progress bars are off while storing
(``TQDM_DISABLE=1``): a bar is a live widget, and what would be stored of it is its first
frame ("0/3"), not the wait a reader never sees.

    python notebooks/store_outputs.py [NOTEBOOK ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _scrub(value: object, root: str) -> object:
    if isinstance(value, str):
        return value.replace(root, "<repo>")
    if isinstance(value, list):
        return [_scrub(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v, root) for k, v in value.items()}
    return value


def store(path: Path) -> float:
    """Run ``path`` top to bottom in a fresh kernel and write it back with its outputs."""
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": scratch}}
        ).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(o) for o in _scrub(cell.outputs, str(REPO))]
            cell.metadata.pop("execution", None)
    nbformat.validator.normalize(nb)
    nbformat.write(nb, path)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    os.environ["TQDM_DISABLE"] = "1"  # the kernels inherit it
    paths = [Path(a).resolve() for a in argv] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        seconds = store(path)
        size = path.stat().st_size / 1024
        print(f"{path.name}: executed in {seconds:.0f} s, stored {size:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
