"""Terminal tables built from the report's column declarations (rig.analysis.columns), cell by cell through the
function the HTML page uses too."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table
from rich.text import Text

from rig.analysis.columns import Column, Readable, cell_text


def add_columns(t: Table, declared: Sequence[Column], fold: bool = False, units: bool = True) -> None:
    """The declared columns as ``t``'s headers: text left, figures right; ``units=False`` where the table's title
    states the unit; ``fold`` wraps long cells instead of cutting them."""
    for c in declared:
        left = c.spec is None and c.yes_no is None
        header = c.titled() if units else c.header
        if fold:
            t.add_column(header, justify="left" if left else "right", overflow="fold")
        else:
            t.add_column(header, justify="left" if left else "right")


def cells(declared: Sequence[Column], row: Readable) -> list[Text | str]:
    """One row's cells; a flag column's text in yellow."""
    return [Text(cell_text(c, row), style="yellow") if c.flag is not None else cell_text(c, row) for c in declared]


def fill(
    t: Table, declared: Sequence[Column], rows: Iterable[Readable], fold: bool = False, units: bool = True
) -> Table:
    """``t`` with the declared columns and one row per item of ``rows``."""
    add_columns(t, declared, fold, units)
    for r in rows:
        t.add_row(*cells(declared, r))
    return t
