"""The one renderer of a result's card as HTML: its facts, grids and lines, every cell escaped."""

from __future__ import annotations

from gpudiag._report import card, html_grid, html_lines, html_table
from gpudiag._views import Block, Carded, Facts, Grid


def _block_html(block: Block) -> str:
    if isinstance(block, Facts):
        return html_table(block.rows, caption=block.caption)
    if isinstance(block, Grid):
        return html_grid(block.header, block.rows)
    return html_lines(block.lines, block.kind, prefix=block.prefix)


def card_html(result: Carded) -> str:
    """``result``'s card (``as_card()``) as HTML."""
    view = result.as_card()
    body = "".join(_block_html(b) for b in view.blocks)
    return card(view.title, body, subtitle=view.subtitle)


__all__ = ["card_html"]
