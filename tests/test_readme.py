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


def test_the_readme_says_the_prometheus_tests_need_the_binary() -> None:
    from tests.fakes.cluster import PROMETHEUS_LINE

    assert PROMETHEUS_LINE in README.read_text(encoding="utf-8").splitlines()


def test_without_prometheus_outside_ci_the_skip_reason_is_the_readme_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.fakes import cluster

    monkeypatch.setattr(cluster, "PROMETHEUS", "/no/such/prometheus")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y prometheus"):
        cluster.prometheus_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="cannot run under CI"):
        cluster.prometheus_or_skip()
