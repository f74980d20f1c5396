"""The GPU check's parts (gpudiag.cli.gpu_check): rows written as they come, the parts merged
into one table whatever stopped them, a row per dependency, a row per test file that does not
collect; and `gpudiag` itself where one dependency is missing."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.cli import gpu_check
from gpudiag.cli.gpu_check import (
    FAILED,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    CheckRow,
    RowSink,
    merge,
    read_rows,
    table,
    write_rows,
)
from gpudiag.errors import GpuDiagError
from tests.conftest import REPO


def test_the_sink_writes_the_rows_after_each_one(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    sink = RowSink(path)
    sink.add(CheckRow("a", PASSED, "1 GPU", 1.5, "t::a"))
    assert [r.path for r in read_rows(path)] == ["a"]
    sink.add(CheckRow("b", FAILED, "boom", 0.5, "t::b"))
    assert read_rows(path) == sink.rows
    assert not list(tmp_path.glob("*.part"))


def _part(folder: Path, stem: str, status: dict[str, object], rows: list[CheckRow] | None) -> None:
    (folder / f"{stem}.status.json").write_text(json.dumps(status))
    if rows is not None:
        write_rows(folder / f"{stem}.json", rows)


def test_merge_keeps_the_parts_order_and_says_what_stopped_each(tmp_path: Path) -> None:
    done = CheckRow("matmul", PASSED, "bf16 700 TFLOP/s", 3.0, "x::m")
    cut = CheckRow("profile", PASSED, "42 kernels", 9.0, "x::p")
    _part(tmp_path, "01-deps", {"part": "deps", "exit": 0, "seconds": 5, "box_s": 60}, [done])
    _part(tmp_path, "02-flows", {"part": "flows", "exit": 124, "seconds": 180, "box_s": 180}, [cut])
    _part(tmp_path, "03-record", {"part": "record", "exit": 2, "seconds": 1, "box_s": 150}, None)
    _part(
        tmp_path,
        "04-compare",
        {"part": "compare", "exit": "not run", "reason": "only 12 s were left"},
        None,
    )
    rows = merge(tmp_path)
    assert [r.path for r in rows] == [
        "matmul",
        "profile",
        "part flows: time box",
        "part record",
        "part compare",
    ]
    assert rows[2].result == FAILED
    assert "stopped at its 180 s time box after 1 row(s)" in rows[2].figure
    assert (rows[3].result, rows[3].figure) == (FAILED, "exit code 2 before any row: see the log")
    assert (rows[4].result, rows[4].figure) == (NOT_RUN, "only 12 s were left")
    assert table(rows).splitlines()[-1] == "2 passed, 2 failed, 0 not applicable, 1 not run"


def test_merge_from_the_command_line_prints_the_table_and_writes_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = CheckRow("MIG", NOT_APPLICABLE, "N/A: MIG is off", 0.1, "x::mig")
    _part(tmp_path, "01-probe", {"part": "probe", "exit": 0, "seconds": 1, "box_s": 60}, [row])
    out = tmp_path / "all.json"
    assert gpu_check.main(["--merge", str(tmp_path), "--json", str(out)]) == 0
    assert "0 passed, 0 failed, 1 not applicable" in capsys.readouterr().out
    assert read_rows(out) == [row]
    assert gpu_check.main(["--merge", str(tmp_path / "missing")]) == 2
    _part(tmp_path, "02-compare", {"part": "compare", "exit": "not run", "reason": "late"}, None)
    assert gpu_check.main(["--merge", str(tmp_path)]) == 1  # a part not run: not a clean run


def test_a_collection_error_is_the_line_that_says_what_failed() -> None:
    text = (
        "ImportError while importing test module '/x/test_a.py'.\n"
        "Traceback:\n  ...\n"
        "E   ModuleNotFoundError: No module named 'msgspec'\n"
    )
    assert gpu_check._collect_failure(text) == "ModuleNotFoundError: No module named 'msgspec'"
    assert gpu_check._collect_failure("") == "unknown collection error"


def test_a_test_file_that_does_not_import_is_a_row_and_the_others_still_run(
    tmp_path: Path,
) -> None:
    tests = tmp_path / "gpu"
    tests.mkdir()
    (tests / "test_broken.py").write_text("import not_a_module_gpudiag_needs\n")
    (tests / "test_fine.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_fine():\n    '''a path that works'''\n"
    )
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag.cli.gpu_check", "--tests", str(tests), "--no-end-to-end",
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r.path: r for r in read_rows(out)}
    broken = rows["collect gpu/test_broken.py"]
    assert broken.result == FAILED
    assert broken.figure == "ModuleNotFoundError: No module named 'not_a_module_gpudiag_needs'"
    assert rows["a path that works"].result == PASSED


def test_a_conftest_that_does_not_import_is_one_failed_row(tmp_path: Path) -> None:
    tests = tmp_path / "gpu"
    tests.mkdir()
    (tests / "conftest.py").write_text("import not_a_module_the_conftest_needs\n")
    (tests / "test_fine.py").write_text("def test_fine():\n    pass\n")
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag.cli.gpu_check", "--tests", str(tests), "--no-end-to-end",
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [row] = read_rows(out)
    assert (row.path, row.result) == (f"pytest on {tests}", FAILED)
    assert "could not run the GPU tests (exit code 4)" in row.figure
    assert "not_a_module_the_conftest_needs" in done.stdout + done.stderr


def test_a_dependency_row_per_runtime_requirement() -> None:
    import tomllib

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [name for name, _ in gpu_check.runtime_requirements()]
    assert len(names) == len(listed)
    assert {"torch", "msgspec", "pydantic", "nvidia-ml-py", "pyyaml"} <= set(names)
    rows = gpu_check.dependency_rows()
    assert [r.path for r in rows[:2]] == [
        "torch (the machine's own)",
        "gpudiag (the code under test)",
    ]
    assert len(rows) == 2 + len(names) - 1  # torch has its own row
    failed = [(r.path, r.figure) for r in rows if r.result != PASSED]
    assert failed == []  # this venv has every dependency: each module name is right
    assert {r.test for r in rows} == {"dependencies"}


def test_a_missing_or_old_dependency_says_what_to_install() -> None:
    with pytest.raises(GpuDiagError, match=r"must be installed beside torch.*wheel folder"):
        gpu_check._import_line("not-a-package-gpudiag-needs", ">=1")
    with pytest.raises(GpuDiagError, match=r"numpy .* is installed; gpudiag needs >=999"):
        gpu_check._import_line("numpy", ">=999")
    assert gpu_check._import_line("pyyaml", ">=6").startswith("pyyaml ")


def test_the_recording_is_named_after_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudiag.probe import cuda

    class Props:
        def __init__(self, name: str) -> None:
            self.name = name

    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    assert gpu_check.recording_name() == "no-cuda-host"
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "device_properties", lambda i: Props("NVIDIA H100 80GB HBM3"))
    assert gpu_check.recording_name() == "h100-sxm5-80gb-1x"
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cuda, "device_properties", lambda i: Props("NVIDIA Future GPU (X)"))
    assert gpu_check.recording_name() == "nvidia-future-gpu-x-2x"


# --- `gpudiag` where one dependency is missing ------------------------------------------------


def _without(monkeypatch: pytest.MonkeyPatch, command: str, missing: str) -> None:
    """`gpudiag.cli.<command>` fails to import as it would without the package ``missing``."""
    import gpudiag.cli as cli

    real = importlib.import_module

    def fake(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name == f"gpudiag.cli.{command}":
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return real(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", fake)


def test_a_command_whose_dependency_is_missing_says_so_and_the_others_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpudiag.cli import build_parser, main

    _without(monkeypatch, "monitor", "msgspec.structs")
    assert "(unavailable here: needs the Python package 'msgspec')" in build_parser().format_help()
    assert main(["monitor", "--seconds", "1", "--csv", "x.csv"]) == 1
    err = capsys.readouterr().err
    assert "`gpudiag monitor` needs the Python package 'msgspec', which is not installed" in err
    with pytest.raises(SystemExit):  # the others still check their arguments
        main(["plan", "--gpus", "8", "--help-me"])
    assert "unrecognized arguments: --help-me" in capsys.readouterr().err


def test_a_missing_module_of_gpudiag_itself_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpudiag.cli import build_parser

    _without(monkeypatch, "monitor", "gpudiag.monitoring.gone")
    with pytest.raises(ModuleNotFoundError, match=r"gpudiag\.monitoring\.gone"):
        build_parser()
