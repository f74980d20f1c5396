"""Kineto / torch.profiler trace analysis: ``analyze_trace(path_or_paths) -> TraceReport``."""

from __future__ import annotations

from gpudiag.analysis.trace.analyze import analyze_trace, analyze_traces
from gpudiag.analysis.trace.collectives import CollectiveReport, CollectiveStats
from gpudiag.analysis.trace.ranks import CommOverlap
from gpudiag.analysis.trace.report import RankReport, TraceReport

__all__ = [
    "CollectiveReport",
    "CollectiveStats",
    "CommOverlap",
    "RankReport",
    "TraceReport",
    "analyze_trace",
    "analyze_traces",
]
