"""The monitor's strip charts have a time axis and a value scale: the helpers monitor.js draws
them with, run in Node (skipped where Node is not installed; the browser test draws them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.conftest import REPO

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js to run widgets/monitor.js")


def _js(expression: str) -> Any:
    module = (REPO / "widgets" / "monitor.js").as_uri()
    script = f'const m = await import("{module}");\nconsole.log(JSON.stringify({expression}));'
    out = subprocess.run(
        [str(NODE), "--input-type=module"],
        input=script,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_time_ticks_count_back_from_now_in_round_steps() -> None:
    minute, fresh, ten_minutes = _js("[m.timeTicks(60), m.timeTicks(0.5), m.timeTicks(600)]")
    assert [t["label"] for t in minute] == ["now", "-15s", "-30s", "-45s", "-1m"]
    assert [t["offsetS"] for t in minute] == [0, -15, -30, -45, -60]
    assert [t["label"] for t in fresh] == ["now", "-0.5s"]
    assert [t["label"] for t in ten_minutes] == ["now", "-5m", "-10m"]


def test_ticks_never_crowd_a_window() -> None:
    counts = _js("[1, 7, 45, 90, 299, 3600].map((s) => m.timeTicks(s).length)")
    assert all(2 <= n <= 5 for n in counts)


def test_value_scale_labels_are_short_and_keep_the_unit() -> None:
    labels = _js(
        '[m.shortValue(100, "%"), m.shortValue(42.5 * 2 ** 30, "B"), m.shortValue(1410, "MHz"),'
        ' m.shortValue(250, "W"), m.shortValue(3.2e9, "B/s"), m.shortValue(0, "%")]'
    )
    assert labels == ["100%", "42.5Gi", "1.41GHz", "250W", "3.2G/s", "0%"]
    assert all(len(label) <= 7 for label in labels)  # fits the axis' 44 px


def test_the_scale_top_is_a_round_number_in_the_unit_shown() -> None:
    tops = _js(
        '[[1.21 * 2 ** 30, "B"], [25.1, "W"], [231, "MHz"], [34.1, "°C"], [7.7 * 2 ** 20, "B"],'
        ' [0.3, ""], [1410, "MHz"]].map(([v, u]) => m.shortValue(m.niceMax(v, u), u))'
    )
    assert tops == ["1.5Gi", "30W", "250MHz", "40°C", "8Mi", "0.3", "1.5GHz"]
    assert _js("[m.niceMax(0, 'W'), m.niceMax(100, '%')]") == [1, 100]
