"""Run every GPU path for real (``pytest -m gpu`` plus an end-to-end run) and print one table.

``make gpu-check`` runs it from the repository root: each GPU path is passed, failed or not
applicable (with the reason: "needs a CUDA GPU" on a machine without one, "N/A: MIG is off"
where a feature is absent) and the figure it measured. The end-to-end part runs the
``gpudiag`` command itself (``inspect --json``, ``record``) in a fresh process and replays
what it wrote. The whole check is sized to finish within ten minutes on one H100.

On a GPU machine without network, ``scripts/gpu/check_offline.sh`` runs it in time-boxed parts
(``--dependencies``, ``--no-tests``, pytest ``-k`` selections), each writing its rows as they
come (``--json``), and prints the one table with ``--merge`` even when a part ran out of time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpudiag.errors import GpuDiagError

PASSED, FAILED, NOT_APPLICABLE, NOT_RUN = "passed", "failed", "not applicable", "not run"
DEFAULT_TESTS = Path("tests") / "gpu"
_PACKAGE = Path(__file__).resolve().parents[1]  # the gpudiag that runs: a checkout's, or installed
_WIDTH = {"path": 62, "result": 14, "figure": 100}


@dataclass(frozen=True)
class CheckRow:
    """One GPU path: its result, the figure it measured (or why it failed / did not apply)."""

    path: str
    result: str
    figure: str
    seconds: float
    test: str = ""


class RowSink:
    """The rows so far, written to ``path`` (JSON) after each one: a part stopped by its time
    box keeps the rows it finished."""

    def __init__(self, path: Path | None = None) -> None:
        self.rows: list[CheckRow] = []
        self.path = path

    def add(self, row: CheckRow) -> None:
        self.rows.append(row)
        if self.path is not None:
            write_rows(self.path, self.rows)


def write_rows(path: Path, rows: list[CheckRow]) -> None:
    """The rows as a JSON list, replaced in one step (a reader never sees half a file)."""
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    partial.replace(path)


def read_rows(path: Path) -> list[CheckRow]:
    fields = CheckRow.__dataclass_fields__
    return [
        CheckRow(**{k: v for k, v in r.items() if k in fields})
        for r in json.loads(path.read_text())
    ]


class _Collector:
    """A pytest plugin that keeps one row per test: outcome, skip reason, recorded figure; and
    one failed row per test file that could not be collected (a missing dependency, say)."""

    def __init__(self, sink: RowSink | None = None) -> None:
        self.sink = sink if sink is not None else RowSink()
        self._titles: dict[str, str] = {}

    @property
    def rows(self) -> list[CheckRow]:
        return self.sink.rows

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            text = _collect_failure(report.longrepr)
            self.sink.add(CheckRow(f"collect {report.nodeid}", FAILED, text, 0.0, report.nodeid))

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            doc = (getattr(getattr(item, "obj", None), "__doc__", None) or "").strip()
            title = doc.splitlines()[0] if doc else item.name.removeprefix("test_")
            param = getattr(getattr(item, "callspec", None), "id", "")
            self._titles[item.nodeid] = f"{title} [{param}]" if param else title

    def pytest_runtest_logreport(self, report: Any) -> None:
        keep = (
            report.when == "call"
            or (report.when == "setup" and not report.passed)
            or (report.when == "teardown" and report.failed)
        )
        if not keep:
            return
        title = self._titles.get(report.nodeid, report.nodeid)
        figures = [str(v) for k, v in report.user_properties if k == "figure"]
        if report.skipped:
            result, text = NOT_APPLICABLE, _skip_reason(report.longrepr)
        elif report.failed:
            result, text = FAILED, _failure(report.longrepr)
        else:
            result, text = PASSED, "; ".join(figures) or "ok"
        self.sink.add(CheckRow(title, result, text, float(report.duration), report.nodeid))


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _failure(longrepr: Any) -> str:
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) or str(longrepr)
    return " ".join(message.split())[:300]


def _collect_failure(longrepr: Any) -> str:
    """The error line of a collection failure (``E   ModuleNotFoundError: ...``)."""
    lines = [line.strip() for line in str(longrepr).splitlines() if line.strip()]
    errors = [line.removeprefix("E").strip() for line in lines if line.startswith("E ")]
    text = (errors or lines or ["unknown collection error"])[-1]
    return " ".join(text.split())[:300]


def run_gpu_tests(
    tests: Path, extra: list[str] | None = None, sink: RowSink | None = None
) -> list[CheckRow]:
    """``pytest -m gpu`` on ``tests``, in this process, one row per test."""
    try:
        import pytest
    except ImportError:
        raise GpuDiagError(
            "the GPU check needs pytest: install it beside gpudiag (see CONTRIBUTING.md)"
        ) from None
    if not tests.is_dir():
        raise GpuDiagError(
            f"{tests} not found: run the GPU check from the root of a gpudiag checkout"
        )
    collector = _Collector(sink)
    args = [
        *("-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts="),
        *("--continue-on-collection-errors", str(tests)),
    ]
    code = pytest.main([*args, *(extra or [])], plugins=[collector])
    if code not in (0, 1, 5) and not collector.rows:  # 5: nothing collected
        # A conftest that does not import (a missing dependency) stops pytest before any test.
        collector.sink.add(
            CheckRow(
                f"pytest on {tests}",
                FAILED,
                f"pytest could not run the GPU tests (exit code {int(code)}): "
                "its error is printed above the table",
                0.0,
                str(tests),
            )
        )
    return collector.rows


def _gpudiag(
    *args: str, timeout_s: float = 300, show_output: bool = False
) -> subprocess.CompletedProcess[str]:
    """``gpudiag ARGS`` in a fresh process; ``show_output``: its output goes on to ours as it
    comes (what a time box cut short is still in the log), only its errors are kept."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", *args],
        stdout=None if show_output else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _step(path: str, fn: Any, test: str = "end-to-end") -> CheckRow:
    start = time.perf_counter()
    try:
        figure = str(fn())
        result = PASSED
    except Exception as exc:  # one failing step must not hide the others' rows
        figure, result = f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}", FAILED
    return CheckRow(path, result, figure, time.perf_counter() - start, test)


def end_to_end(out_dir: Path, sink: RowSink | None = None) -> list[CheckRow]:
    """The ``gpudiag`` command in a fresh process: a JSON snapshot and a recording, replayed."""
    from gpudiag.probe.replay import ReplayBackend

    sink = sink if sink is not None else RowSink()

    def inspect_json() -> str:
        done = _gpudiag("inspect", "--json")
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or f"exit code {done.returncode}")
        snapshot = json.loads(done.stdout)
        replay = ReplayBackend.from_snapshot(snapshot, label="gpudiag inspect --json")
        return f"{len(replay.gpu_infos())} GPU(s) in the snapshot, replayed"

    def record() -> str:
        sys.stdout.flush()
        done = _gpudiag("record", str(out_dir), timeout_s=420, show_output=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-240:] or f"exit code {done.returncode}")
        from gpudiag.cli.record import replay_recording

        replayed = replay_recording(out_dir)
        return f"{len(replayed)} files recorded and replayed: " + ", ".join(replayed)

    sink.add(_step("`gpudiag inspect --json` -> replay", inspect_json))
    sink.add(_step("`gpudiag record` -> replay every file", record))
    return sink.rows


# --- what the check runs on: torch, gpudiag and each runtime dependency -------------------

# Distribution name -> the module it installs, where the two differ.
_IMPORT_NAMES = {"nvidia-ml-py": "pynvml", "pyyaml": "yaml", "ipython": "IPython"}
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(;.*)?$")


def runtime_requirements() -> list[tuple[str, str]]:
    """gpudiag's runtime requirements as (distribution, version specifier): from the
    ``pyproject.toml`` beside the gpudiag that runs (a checkout), else its installed metadata."""
    pyproject = _PACKAGE.parent / "pyproject.toml"
    lines: list[str] = []
    if pyproject.is_file() and sys.version_info >= (3, 11):  # tomllib; else the metadata
        import tomllib

        lines = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    if not lines:
        from importlib import metadata

        try:
            lines = metadata.requires("gpudiag") or []
        except metadata.PackageNotFoundError:
            raise GpuDiagError(
                "gpudiag's requirements are unknown: run from a checkout or install gpudiag"
            ) from None
    found = []
    for line in lines:
        match = _REQUIREMENT.match(line)
        if match is None or (match.group(3) and "extra" in match.group(3)):
            continue
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        found.append((name, match.group(2).strip().strip("()")))
    return found


def _satisfies(version: str, specifier: str) -> bool | None:
    """Whether ``version`` meets ``specifier``; None where ``packaging`` is not installed."""
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return None
    return SpecifierSet(specifier).contains(version, prereleases=True)


def _import_line(distribution: str, specifier: str) -> str:
    import importlib
    from importlib import metadata

    module = _IMPORT_NAMES.get(distribution, distribution.replace("-", "_"))
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # missing, or present but broken (one of its own needs too old)
        raise GpuDiagError(
            f"import {module}: {type(exc).__name__}: {exc}. {distribution} must be installed "
            "beside torch: on a machine without network it travels in the wheel folder "
            "(make gpu-wheels, CONTRIBUTING.md)"
        ) from None
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        version = str(getattr(imported, "__version__", "?"))
    where = Path(getattr(imported, "__file__", None) or ".").resolve().parent.parent
    fits = _satisfies(version, specifier) if specifier and version != "?" else True
    if fits is False:
        raise GpuDiagError(f"{distribution} {version} is installed; gpudiag needs {specifier}")
    unchecked = " (version not checked: no packaging)" if fits is None else ""
    return f"{distribution} {version} from {where}{unchecked}"


def _torch_line() -> str:
    import torch

    from gpudiag.probe import cuda

    where = Path(torch.__file__).resolve().parent
    line = f"torch {torch.__version__} (CUDA build {cuda.built_with_cuda()}) from {where}"
    count = cuda.device_count()
    if count == 0:
        return line + "; no usable CUDA device"
    names = [cuda.device_properties(i).name for i in range(count)]
    return line + f"; {count} CUDA device(s): " + ", ".join(names)


def _gpudiag_line() -> str:
    from gpudiag._version import __version__

    return f"gpudiag {__version__} from {_PACKAGE}"


def dependency_rows(sink: RowSink | None = None) -> list[CheckRow]:
    """One row for torch, one for gpudiag and one per runtime dependency: a missing or too old
    package is a failed row that says what to install, not a crash of the whole check."""
    sink = sink if sink is not None else RowSink()
    sink.add(_step("torch (the machine's own)", _torch_line, "dependencies"))
    sink.add(_step("gpudiag (the code under test)", _gpudiag_line, "dependencies"))
    for name, specifier in runtime_requirements():
        if name == "torch":
            continue
        row = _step(
            f"import {name}{specifier}",
            lambda n=name, s=specifier: _import_line(n, s),
            "dependencies",
        )
        sink.add(row)
    return sink.rows


def recording_name() -> str:
    """``<gpu>-<count>x`` for ``tests/fixtures/recorded/``: the spec table's key of the first
    GPU (``h100-sxm5-80gb-1x``), its name made lower case where the table lacks it."""
    from gpudiag.probe import cuda
    from gpudiag.specs import lookup_gpu

    count = cuda.device_count()
    if count == 0:
        return "no-cuda-host"
    name = cuda.device_properties(0).name
    spec = lookup_gpu(name)
    key = spec.key if spec is not None else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{key}-{count}x"


# --- parts run one by one (each in its own time box) and merged into one table -------------

STATUS_SUFFIX = ".status.json"
_TIMED_OUT = (124, 137)  # `timeout`'s exit codes: the time box was reached (TERM, then KILL)


def merge(folder: Path) -> list[CheckRow]:
    """The rows of the parts run into ``folder``, in the parts' order.

    Each part ``NAME`` left ``NAME.status.json`` (``{"part", "exit", "seconds", "box_s"}``,
    written by the script that ran it) and, if it got that far, ``NAME.json`` (its rows, written
    as they came). A part stopped by its time box, that could not start, or that crashed before
    a row gets a row of its own saying so.
    """
    rows: list[CheckRow] = []
    for status_path in sorted(folder.glob(f"*{STATUS_SUFFIX}")):
        status = json.loads(status_path.read_text())
        part = str(status.get("part") or status_path.name.removesuffix(STATUS_SUFFIX))
        rows_path = status_path.with_name(status_path.name.removesuffix(STATUS_SUFFIX) + ".json")
        part_rows = read_rows(rows_path) if rows_path.is_file() else []
        rows += part_rows
        code, seconds = status.get("exit"), float(status.get("seconds") or 0)
        box = float(status.get("box_s") or 0)
        if code == "not run":
            rows.append(CheckRow(f"part {part}", NOT_RUN, str(status.get("reason", "")), 0.0))
        elif code in _TIMED_OUT:
            rows.append(
                CheckRow(
                    f"part {part}: time box",
                    FAILED,
                    f"stopped at its {box:.0f} s time box after {len(part_rows)} row(s); "
                    "the rows above finished. Run this part alone with a longer box",
                    seconds,
                    part,
                )
            )
        elif code not in (0, 1) and not part_rows:
            rows.append(
                CheckRow(
                    f"part {part}",
                    FAILED,
                    f"exit code {code} before any row: see the log",
                    seconds,
                    part,
                )
            )
    return rows


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def table(rows: list[CheckRow]) -> str:
    """The rows as one plain-text table with a totals line."""
    header = f"{'GPU path':<{_WIDTH['path']}}  {'result':<{_WIDTH['result']}}  {'s':>6}  figure"
    lines = [header, "-" * len(header.rstrip()) + "-" * 40]
    for r in rows:
        lines.append(
            f"{_cut(r.path, _WIDTH['path']):<{_WIDTH['path']}}  "
            f"{r.result:<{_WIDTH['result']}}  {r.seconds:6.1f}  {_cut(r.figure, _WIDTH['figure'])}"
        )
    counts = {
        k: sum(r.result == k for r in rows) for k in (PASSED, FAILED, NOT_APPLICABLE, NOT_RUN)
    }
    totals = (
        f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_APPLICABLE]} not applicable"
    )
    if counts[NOT_RUN]:
        totals += f", {counts[NOT_RUN]} not run"
    lines.append(totals)
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tests", type=Path, default=DEFAULT_TESTS, help="the GPU tests folder")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="where the end-to-end `gpudiag record` writes (default: a temporary folder)",
    )
    where.add_argument(
        "--record-root",
        type=Path,
        metavar="DIR",
        help="record into DIR/<gpu>-<count>x (the name tests/fixtures/recorded/ uses)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the rows as JSON (after each row)"
    )
    parser.add_argument(
        "--dependencies",
        action="store_true",
        help="first a row for torch, gpudiag and each runtime dependency (version, where from)",
    )
    parser.add_argument("--no-tests", action="store_true", help="skip the pytest part")
    parser.add_argument(
        "--no-end-to-end", action="store_true", help="only the pytest part (no `gpudiag record`)"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        metavar="DIR",
        help="print the one table of the parts run into DIR (NAME.status.json and NAME.json)",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (e.g. -k matmul)")


def _print_table(rows: list[CheckRow], started: float, what: str = "gpu-check") -> None:
    print()
    print(table(rows))
    print(f"{what} took {time.perf_counter() - started:.0f} s")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.merge is not None:
        if not args.merge.is_dir():
            raise GpuDiagError(f"{args.merge} is not a folder of GPU-check parts")
        rows = merge(args.merge)
        print(table(rows))
        if args.json is not None:
            write_rows(args.json, rows)
        return 1 if any(r.result in (FAILED, NOT_RUN) for r in rows) else 0
    sink = RowSink(args.json)
    if args.json is not None:
        write_rows(args.json, [])
    if args.dependencies:
        dependency_rows(sink)
    if not args.no_tests:
        run_gpu_tests(args.tests, list(args.pytest_args), sink)
    if not args.no_end_to_end:
        if args.record_root is not None:
            target = args.record_root / recording_name()
            print(f"gpu-check: recording into {target}", flush=True)
            end_to_end(target, sink)
        elif args.record is not None:
            end_to_end(args.record, sink)
        else:
            with tempfile.TemporaryDirectory(prefix="gpudiag-gpu-check-") as tmp:
                end_to_end(Path(tmp) / "recording", sink)
    _print_table(sink.rows, started)
    return 1 if any(r.result == FAILED for r in sink.rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudiag.cli.gpu_check", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except GpuDiagError as exc:
        print(f"gpu-check: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
