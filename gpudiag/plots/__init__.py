"""Plotly figure builders (data in, figure out), registered as the figures of the results.

Importing this package is light: each figure is registered by name and its module (and
plotly) is imported the first time a result of that type is plotted.
"""

from __future__ import annotations

from gpudiag import _views

_FIGURES = {
    "gpudiag.analysis.roofline.Roofline": "gpudiag.plots.roofline:roofline_figure",
    "gpudiag.analysis.trace.ledger.Ledger": "gpudiag.plots.ledger:ledger_figure",
    "gpudiag.analysis.nccl.CollectiveResult": "gpudiag.plots.bench:collective_results_figure",
    "gpudiag.bench.gemm.MatmulResult": "gpudiag.plots.bench:matmul_figure",
    "gpudiag.bench.memory.BandwidthResult": "gpudiag.plots.bench:bandwidth_figure",
    "gpudiag.bench.sdpa.AttentionResult": "gpudiag.plots.bench:attention_figure",
    "gpudiag.experiment.comparison.Comparison": "gpudiag.plots.compare:comparison_figure",
    "gpudiag.experiment.fit.FitResult": "gpudiag.plots.memory:fit_figure",
    "gpudiag.experiment.memory_report.MemoryReport": "gpudiag.plots.memory:memory_report_figure",
    "gpudiag.experiment.plan.Plan": "gpudiag.plots.plan:plan_figure",
    "gpudiag.analysis.snapshot_diff.SnapshotDiff": "gpudiag.plots.memory:snapshot_diff_figure",
    "gpudiag.analysis.snapshot_diff.SnapshotRanks": "gpudiag.plots.memory:snapshot_ranks_figure",
    "gpudiag.tune.result.TuneResult": "gpudiag.plots.tune:tune_figure",
}

for _type_name, _builder in _FIGURES.items():
    _views.register("figure", _type_name, _builder)
