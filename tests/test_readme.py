"""The README says what a fresh clone needs, and the tests that need it say the same thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.test_monitor_browser import CHROMIUM, CHROMIUM_LINE, _missing

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_says_the_browser_tests_need_chromium() -> None:
    assert CHROMIUM_LINE in README.read_text(encoding="utf-8").splitlines()


def test_without_chromium_the_skip_reason_is_the_readme_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tests.browser.test_monitor_browser.CHROMIUM", CHROMIUM.parent / "no-such")
    reason = _missing()
    assert reason is not None
    assert reason.endswith(CHROMIUM_LINE)
