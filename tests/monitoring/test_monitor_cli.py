"""`gpudiag monitor` in the terminal: the live table, --json, and recordings."""

from __future__ import annotations

import io
import json
import threading

import pytest

from gpudiag.cli import main
from gpudiag.cli import monitor as cli_monitor


def test_json_output_has_summary_and_samples(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["monitor", "--replay", "demo", "--duration", "0.3", "--interval", "0.05", "--json"]
    )
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["monitor"]["is_recording"] is True
    assert payload["monitor"]["state"] == "stopped"
    samples = payload["samples"]
    assert len(samples["series"]) == len(samples["values"][0]) == len(samples["units"])
    assert len(samples["time"]) == len(samples["values"]) >= 2
    rows = {(r["device"], r["metric"]): r for r in payload["summary"]["rows"]}
    # The RTX 3090 snapshot reads 35.15 W; N/A stays null with its reason.
    assert rows[("rtx-3090 box/gpu0", "power_w")]["p50"] == 35.15
    sm = rows[("rtx-3090 box/gpu0", "sm_active_pct")]
    assert sm["p50"] is None
    assert "no activity counters" in sm["reason"]
    assert not [t for t in threading.enumerate() if t.name == "gpudiag-monitor"]


def test_text_mode_prints_tables_and_the_summary() -> None:
    out = io.StringIO()
    args = cli_monitor.argparse.Namespace(
        interval=0.05,
        duration=0.25,
        replay="demo",
        exporter=None,
        prometheus=None,
        selector="",
        devices=None,
        refresh=0.1,
        json=False,
    )
    assert cli_monitor.run(args, out) == 0
    text = out.getvalue()
    assert "\x1b[2J" not in text  # not a terminal: plain blocks, no screen clearing
    assert text.count("GPU utilization") >= 2
    assert "throttled since" in text
    assert "~ rough" in text
    assert "N/A SM active" in text
    assert "Monitor summary" in text


def test_bad_refresh_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--replay", "demo", "--refresh", "0"]) == 1
    assert "--refresh must be a positive number" in capsys.readouterr().err
