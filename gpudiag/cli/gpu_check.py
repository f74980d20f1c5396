"""Run every GPU path for real (``pytest -m gpu`` plus an end-to-end run) and print one table.

``make gpu-check`` runs it from the repository root: each GPU path is passed, failed or not
applicable (with the reason: "needs a CUDA GPU" on a machine without one, "N/A: MIG is off"
where a feature is absent) and the figure it measured. The end-to-end part runs the
``gpudiag`` command itself (``inspect --json``, ``record``) in a fresh process and replays
what it wrote. The whole check is sized to finish within ten minutes on one H100.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpudiag.errors import GpuDiagError

PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
DEFAULT_TESTS = Path("tests") / "gpu"
_WIDTH = {"path": 62, "result": 14, "figure": 100}


@dataclass(frozen=True)
class CheckRow:
    """One GPU path: its result, the figure it measured (or why it failed / did not apply)."""

    path: str
    result: str
    figure: str
    seconds: float
    test: str = ""


class _Collector:
    """A pytest plugin that keeps one row per test: outcome, skip reason, recorded figure."""

    def __init__(self) -> None:
        self.rows: list[CheckRow] = []
        self._titles: dict[str, str] = {}

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
        self.rows.append(CheckRow(title, result, text, float(report.duration), report.nodeid))


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _failure(longrepr: Any) -> str:
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) or str(longrepr)
    return " ".join(message.split())[:300]


def run_gpu_tests(tests: Path, extra: list[str] | None = None) -> list[CheckRow]:
    """``pytest -m gpu`` on ``tests``, in this process, one row per test."""
    try:
        import pytest
    except ImportError:
        raise GpuDiagError(
            "the GPU check needs pytest: pip install -e '.[dev]' (see CONTRIBUTING.md)"
        ) from None
    if not tests.is_dir():
        raise GpuDiagError(
            f"{tests} not found: run `make gpu-check` from the root of a gpudiag checkout"
        )
    collector = _Collector()
    args = ["-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(tests)]
    code = pytest.main([*args, *(extra or [])], plugins=[collector])
    if code not in (0, 1, 5) and not collector.rows:  # 5: nothing collected
        raise GpuDiagError(f"pytest could not run the GPU tests (exit code {code})")
    return collector.rows


def _gpudiag(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _step(path: str, fn: Any) -> CheckRow:
    start = time.perf_counter()
    try:
        figure = str(fn())
        result = PASSED
    except Exception as exc:  # one failing step must not hide the others' rows
        figure, result = f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}", FAILED
    return CheckRow(path, result, figure, time.perf_counter() - start, "end-to-end")


def end_to_end(out_dir: Path) -> list[CheckRow]:
    """The ``gpudiag`` command in a fresh process: a JSON snapshot and a recording, replayed."""
    from gpudiag.probe.replay import ReplayBackend

    def inspect_json() -> str:
        done = _gpudiag("inspect", "--json")
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or f"exit code {done.returncode}")
        snapshot = json.loads(done.stdout)
        replay = ReplayBackend.from_snapshot(snapshot, label="gpudiag inspect --json")
        return f"{len(replay.gpu_infos())} GPU(s) in the snapshot, replayed"

    def record() -> str:
        done = _gpudiag("record", str(out_dir), timeout_s=420)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-240:] or f"exit code {done.returncode}")
        from gpudiag.cli.record import replay_recording

        replayed = replay_recording(out_dir)
        return f"{len(replayed)} files recorded and replayed: " + ", ".join(replayed)

    return [
        _step("`gpudiag inspect --json` -> replay", inspect_json),
        _step("`gpudiag record` -> replay every file", record),
    ]


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
    counts = {k: sum(r.result == k for r in rows) for k in (PASSED, FAILED, NOT_APPLICABLE)}
    lines.append(
        f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_APPLICABLE]} not applicable"
    )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tests", type=Path, default=DEFAULT_TESTS, help="the GPU tests folder")
    parser.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="where the end-to-end `gpudiag record` writes (default: a temporary folder)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    parser.add_argument(
        "--no-end-to-end", action="store_true", help="only the pytest part (no `gpudiag record`)"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (e.g. -k matmul)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    rows = run_gpu_tests(args.tests, list(args.pytest_args))
    if not args.no_end_to_end:
        if args.record is not None:
            rows += end_to_end(args.record)
        else:
            with tempfile.TemporaryDirectory(prefix="gpudiag-gpu-check-") as tmp:
                rows += end_to_end(Path(tmp) / "recording")
    print()
    print(table(rows))
    print(f"gpu-check took {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 1 if any(r.result == FAILED for r in rows) else 0


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
