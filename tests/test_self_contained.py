"""A clone of the repository tests with nothing beside it: no test path leaves the repository.

The conftest's audit hook fails the session when a test opens a file beside the repository at
run time; this scan also catches paths built for subprocesses (notebooks, the CLI), which that
hook cannot see.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO

# Ways a path climbs out of the repository: a path built from REPO.parent, a literal ../ or the
# sibling corpus by name; and Path(__file__).parents[k] that reaches above the repository root.
_ESCAPES = re.compile(r"REPO\.parent\s*/|[\"']\.\./|\bshared/fixtures")
_PARENTS = re.compile(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")


def _sources() -> list[Path]:
    roots = [REPO / "tests", REPO / "benchmarks", REPO / "notebooks"]
    files = [p for root in roots for p in root.rglob("*") if p.suffix in {".py", ".ipynb"}]
    return sorted(p for p in files if "fixtures" not in p.relative_to(REPO).parts[:2])


def _escapes(text: str, depth: int = 1) -> list[str]:
    """What in ``text`` leaves the repository, for a file whose repo path has ``depth`` parts."""
    found = [m.group(0) for m in _ESCAPES.finditer(text)]
    found += [m.group(0) for m in _PARENTS.finditer(text) if int(m.group(1)) >= depth]
    return found


def test_the_scan_sees_each_way_out() -> None:
    for line in (
        "FIXTURES = REPO.parent / " + '"corpus" / "fixtures"',
        "root = Path(__file__).parents[3]",
        "open(" + '"../corpus/x.json")',
        "see shared/fixtures/traces",
    ):
        assert _escapes(line, depth=2), line
    assert not _escapes('FIXTURES = REPO / "tests" / "fixtures"', depth=2)
    assert not _escapes("REPO = Path(__file__).resolve().parents[2]", depth=3)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_path_leaves_the_repository(path: Path) -> None:
    if path == Path(__file__):
        return
    depth = len(path.relative_to(REPO).parts)
    assert _escapes(path.read_text(encoding="utf-8"), depth) == []


def test_recorded_fixtures_live_in_the_repository() -> None:
    assert FIXTURES.is_relative_to(REPO)
    folders = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert folders, "tests/fixtures is empty"
    for folder in folders:
        # Each copied folder keeps the attribution its licence asks for.
        assert (FIXTURES / folder / "SOURCES.md").is_file(), folder


def test_fixtures_stay_lean() -> None:
    size = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert size < 30 * 1024 * 1024, f"tests/fixtures holds {size / 2**20:.1f} MiB"


def test_the_audit_hook_records_a_read_beside_the_repository() -> None:
    from tests import conftest

    before = list(conftest._OUTSIDE_READS)
    corpus = "shared"  # the folder the fixture corpus sits in beside a checkout
    beside = str(REPO.parent / corpus / "fixtures" / "x.json")
    try:
        conftest._watch_opens("open", (beside, "r", 0))
        conftest._watch_opens("open", (str(FIXTURES / "README.md"), "r", 0))
        assert conftest._OUTSIDE_READS[len(before) :] == [beside]
    finally:
        del conftest._OUTSIDE_READS[len(before) :]
