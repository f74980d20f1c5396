"""The README's "Diagnose your own training step" runs as written: the Python and the cell."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from gpudiag.rules import Diagnosis
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _section_blocks() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Diagnose your own training step", 1)[1].split("\n#", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def test_the_python_snippet_runs_and_diagnoses() -> None:
    (code,) = [body for lang, body in _section_blocks() if lang == "python"]
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    diagnosis = namespace["diagnosis"]
    assert isinstance(diagnosis, Diagnosis)
    assert "trace" in diagnosis.sources
    assert diagnosis.workload is namespace["workload"]


def test_the_cell_magic_snippet_runs_on_the_notebook_variables(ipython_shell: Any) -> None:
    blocks = _section_blocks()
    cell = next(body for _, body in blocks if body.startswith("%%gpudiag doctor"))
    line, body = cell.split("\n", 1)
    assert line == "%%gpudiag doctor"
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 3)
    ipython_shell.user_ns.update(
        torch=torch,
        model=model,
        opt=torch.optim.SGD(model.parameters(), lr=0.1),
        x=torch.randn(32, 16),
        y=torch.randint(0, 3, (32,)),
    )
    diagnosis = ipython_shell.run_cell_magic(
        "gpudiag", "doctor --steps 1 --no-scaling --no-widget", body
    )
    assert isinstance(diagnosis, Diagnosis)
    assert diagnosis.workload.model is model
