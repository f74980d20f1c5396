"""The monitor plot: a pure function from Monitor.samples() to a plotly Figure."""

from __future__ import annotations

import math

import pandas as pd

from gpudiag.monitoring import Monitor
from gpudiag.monitoring.metrics import SeriesKey
from gpudiag.plots.monitor import monitor_figure
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedFeed


def samples() -> pd.DataFrame:
    clock = FakeClock(1_700_000_000.0)
    feed = ScriptedFeed(clock, width=3, values=lambda n: [float(n), math.nan, n * 2.0 * (1 << 30)])
    feed.series = (*feed.series[:2], SeriesKey("gpu0", "memory_used_bytes"))
    m = Monitor(feed, interval=1.0, start=False, clock=clock)
    for _ in range(4):
        m.tick()
        clock.advance(1.0)
    return m.samples()


def test_one_strip_per_metric_with_data_and_readable_units() -> None:
    fig = monitor_figure(samples())
    titles = [a.text for a in fig.layout.annotations]
    # The all-N/A series is left out; bytes are shown in GiB.
    assert titles == ["GPU utilization (%)", "Memory used (GiB)"]
    util, memory = fig.data
    assert list(util.y) == [1.0, 2.0, 3.0, 4.0]
    assert list(memory.y) == [2.0, 4.0, 6.0, 8.0]


def test_metric_choice_and_order() -> None:
    fig = monitor_figure(samples(), metrics=["memory_used_bytes"])
    assert [a.text for a in fig.layout.annotations] == ["Memory used (GiB)"]
    assert len(fig.data) == 1


def test_empty_samples_give_an_empty_titled_figure() -> None:
    fig = monitor_figure(samples().iloc[0:0])
    assert fig.layout.title.text == "no monitor samples"
    assert monitor_figure(samples(), metrics=["power_w"]).layout.title.text.startswith("no data")


def test_a_cluster_figure_draws_one_line_per_node_the_mean_of_its_gpus() -> None:
    import numpy as np
    import pandas as pd

    from gpudiag.plots.monitor import monitor_figure

    cols = [(f"n{n}/gpu{g}", "gpu_util_pct") for n in range(3) for g in range(6)]
    values = np.array([[10.0 * n + g for n in range(3) for g in range(6)]] * 4)
    df = pd.DataFrame(values, columns=pd.MultiIndex.from_tuples(cols, names=["device", "metric"]))
    df.attrs.update(
        hosts={d: d.split("/")[0] for d, _ in cols}, units={f"{d}/{m}": "%" for d, m in cols}
    )
    fig = monitor_figure(df)
    assert [t.name for t in fig.data] == ["node n0", "node n1", "node n2"]
    assert list(fig.data[1].y) == [12.5] * 4  # (10 + 11 + ... + 15) / 6
    assert len(monitor_figure(df, devices=["n0/gpu0", "n0/gpu1"]).data) == 2  # picked: as is
