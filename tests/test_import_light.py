"""`import gpudiag` stays light: no torch, no NVML bindings, no plotly, no NVML/CUDA init."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_import_gpudiag_imports_nothing_heavy() -> None:
    loaded = _modules_after("import gpudiag")
    for heavy in (
        "torch",
        "pynvml",
        "plotly",
        "pandas",
        "numpy",
        "IPython",
        "ipywidgets",
        "psutil",
    ):
        assert heavy not in loaded, f"import gpudiag imported {heavy}"


def test_public_names_resolve_lazily() -> None:
    loaded = _modules_after("import gpudiag as gd\ngd.ReplayBackend")
    assert "gpudiag.probe.replay" in loaded
    assert "torch" not in loaded
