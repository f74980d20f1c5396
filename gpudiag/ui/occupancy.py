"""Interactive occupancy explorer: launch sliders, live result, occupancy-vs-block-size plot."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from gpudiag._report import esc
from gpudiag.analysis.occupancy import (
    Occupancy,
    OccupancyInputError,
    best_block_size,
    block_size_advice,
    occupancy,
    occupancy_curve,
)
from gpudiag.errors import GpuDiagError
from gpudiag.specs import cc_limits, known_compute_capabilities, parse_compute_capability
from gpudiag.ui.fallback import TextFallback

_KIB = 1024
_DEFAULT_CARVEOUT = "default"


def split_smem(total_bytes: int, limit_static: int = 48 * _KIB) -> tuple[int, int]:
    """(static, dynamic) for a total: static shared memory is capped at 48 KiB, the rest is
    dynamic. The occupancy is the same for any split; this keeps each part legal."""
    static = min(total_bytes, limit_static)
    return static, total_bytes - static


def _cc_options() -> list[tuple[str, tuple[int, int]]]:
    options = []
    for cc in known_compute_capabilities():
        limits = cc_limits(cc)
        label = f"{cc[0]}.{cc[1]} {limits.architecture}"
        if limits.examples:
            label += f" ({limits.examples})"
        options.append((label, cc))
    return options


class OccupancyExplorer(TextFallback, widgets.VBox):
    """Sliders (threads, registers, shared memory), a compute-capability and carveout choice,
    the resulting :class:`Occupancy` and a plot of occupancy against block size.

    ``occupancy`` is the current result (None while the inputs are invalid); ``refresh()``
    recomputes (the controls call it themselves).
    """

    def fallback_text(self) -> str:
        """The current occupancy (sliders need a widget front end)."""
        if self.occupancy is None:
            return "Occupancy explorer: the inputs are not valid (see the message in the widget)"
        return repr(self.occupancy)

    def fallback_html(self) -> str:
        return str(self.result.value)

    def __init__(
        self,
        cc: object = (8, 0),
        threads_per_block: int = 256,
        regs_per_thread: int = 32,
        smem_per_block: int = 0,
        *,
        carveout_kib: int | None = None,
        barriers_per_block: int = 1,
    ) -> None:
        from gpudiag.plots.occupancy import occupancy_curve_figure

        key = parse_compute_capability(cc)
        limits = cc_limits(key)
        self._barriers = barriers_per_block
        self.cc_dropdown = widgets.Dropdown(
            options=_cc_options(),
            value=key,
            description="compute cap.",
            style={"description_width": "110px"},
            layout=widgets.Layout(width="520px"),
        )
        slider = {
            "continuous_update": False,
            "style": {"description_width": "110px"},
            "layout": widgets.Layout(width="520px"),
        }
        self.threads = widgets.IntSlider(
            value=max(1, threads_per_block),
            min=32 if threads_per_block % 32 == 0 else 1,
            max=limits.max_threads_per_block,
            step=32 if threads_per_block % 32 == 0 else 1,
            description="threads/block",
            **slider,
        )
        self.regs = widgets.IntSlider(
            value=regs_per_thread,
            min=0,
            max=limits.max_registers_per_thread,
            description="registers/thread",
            **slider,
        )
        self.smem_kib = widgets.IntSlider(
            value=round(smem_per_block / _KIB),
            min=0,
            max=limits.max_shared_memory_per_block_optin_bytes // _KIB,
            description="smem KiB/block",
            **slider,
        )
        self.carveout = widgets.Dropdown(
            options=self._carveout_options(key),
            value=_carveout_choice(key, carveout_kib),
            description="carveout KiB",
            style={"description_width": "110px"},
        )
        self.result = widgets.HTML()
        self.occupancy: Occupancy | None = None
        self.best: Occupancy | None = None
        self.figure = _figure_widget(occupancy_curve_figure([]))
        super().__init__(
            children=[
                self.cc_dropdown,
                self.threads,
                self.regs,
                self.smem_kib,
                self.carveout,
                self.result,
                self.figure,
            ]
        )
        self.cc_dropdown.observe(self._on_cc, names="value")
        for control in (self.threads, self.regs, self.smem_kib, self.carveout):
            control.observe(self._on_change, names="value")
        self.refresh()

    @staticmethod
    def _carveout_options(cc: tuple[int, int]) -> list[Any]:
        return [_DEFAULT_CARVEOUT, *cc_limits(cc).shared_memory_carveouts_kib]

    def _on_cc(self, change: dict[str, Any]) -> None:
        limits = cc_limits(change["new"])
        with self.hold_trait_notifications():
            self.smem_kib.max = limits.max_shared_memory_per_block_optin_bytes // _KIB
            options = self._carveout_options(limits.compute_capability)
            if self.carveout.value not in options:
                self.carveout.value = _DEFAULT_CARVEOUT
            self.carveout.options = options
        self.refresh()

    def _on_change(self, change: dict[str, Any]) -> None:
        self.refresh()

    def refresh(self) -> None:
        from gpudiag.plots.occupancy import occupancy_curve_figure

        cc = self.cc_dropdown.value
        static, dynamic = split_smem(self.smem_kib.value * _KIB)
        carveout = None if self.carveout.value == _DEFAULT_CARVEOUT else int(self.carveout.value)
        common: dict[str, Any] = {
            "dynamic_smem_per_block": dynamic,
            "carveout_kib": carveout,
            "barriers_per_block": self._barriers,
        }
        try:
            current = occupancy(cc, self.threads.value, self.regs.value, static, **common)
            curve = occupancy_curve(cc, self.regs.value, static, **common)
            try:
                _, best = best_block_size(cc, self.regs.value, static, **common)
            except GpuDiagError:
                best = None
        except GpuDiagError as exc:
            self.occupancy = self.best = None
            self.result.value = f"<div style='color:#b00'>{esc(exc)}</div>"
            return
        self.occupancy, self.best = current, best
        advice = block_size_advice(
            current, best, carveout_kib=carveout, barriers_per_block=self._barriers
        )
        best_line = "".join(f"<div>{esc(line)}</div>" for line in advice)
        self.result.value = current._repr_html_() + best_line
        new = occupancy_curve_figure(curve, current=current, best=best)
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(list(new.data))
            self.figure.layout = new.layout


def _carveout_choice(cc: tuple[int, int], carveout_kib: int | None) -> Any:
    if carveout_kib is None:
        return _DEFAULT_CARVEOUT
    valid = [k for k in cc_limits(cc).shared_memory_carveouts_kib if k >= carveout_kib]
    if not valid:
        raise OccupancyInputError(
            f"carveout {carveout_kib} KiB is more than an SM of compute capability "
            f"{cc[0]}.{cc[1]} has ({cc_limits(cc).shared_memory_carveouts_kib[-1]} KiB at most)."
        )
    return valid[0]  # the configuration the driver rounds a request up to


def _figure_widget(figure: Any) -> Any:
    import plotly.graph_objects as go

    return go.FigureWidget(figure)


def occupancy_explorer(
    cc: object = (8, 0),
    threads_per_block: int = 256,
    regs_per_thread: int = 32,
    smem_per_block: int = 0,
    *,
    carveout_kib: int | None = None,
    barriers_per_block: int = 1,
) -> OccupancyExplorer:
    """Build the explorer widget (display it, or return it from a notebook cell)."""
    return OccupancyExplorer(
        cc,
        threads_per_block,
        regs_per_thread,
        smem_per_block,
        carveout_kib=carveout_kib,
        barriers_per_block=barriers_per_block,
    )
