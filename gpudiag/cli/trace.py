"""Analyse torch.profiler / Kineto traces: GPU time breakdown, kernels, syncs, per rank."""

from __future__ import annotations

from gpudiag.commands.trace import add_arguments, run

__all__ = ["add_arguments", "run"]
