"""The CSV files dtbench writes (summary.csv, rankings.csv, claims.csv, ...), safe to open in a spreadsheet: a text
cell that a spreadsheet would run as a formula is written as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

#: The first characters that make a spreadsheet read a cell as a formula (OWASP's "CSV injection": =, +, -, @, and
#: the tab and carriage return that some spreadsheets skip before one).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: The prefix that makes such a cell text: a spreadsheet shows the cell without it.
QUOTE = "'"


def text_cell(value: Any) -> Any:
    """A string that begins like a formula, with QUOTE before it; anything else (numbers, negative ones too) as is."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return QUOTE + value
    return value


def as_written(value: Any) -> Any:
    """A cell read back from a file write_csv wrote: text_cell undone."""
    if isinstance(value, str) and value.startswith(QUOTE) and value[1:].startswith(FORMULA_START):
        return value[1:]
    return value


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """`frame.to_csv(path, index=False)` with every string cell that begins like a formula made text (text_cell).
    Columns of numbers are untouched, so pandas reads them back as numbers; only object and string columns, which
    hold the labels, names and messages, are looked at."""
    safe = frame.copy()
    for column in safe.columns:
        if _text(safe[column]):
            safe[column] = safe[column].map(text_cell, na_action="ignore")
    safe.to_csv(path, index=False)


def read_csv(path: str | Path) -> pd.DataFrame:
    """A CSV file that write_csv wrote, its text cells as they were before (as_written)."""
    frame = pd.read_csv(path)
    for column in frame.columns:
        if _text(frame[column]):
            frame[column] = frame[column].map(as_written, na_action="ignore")
    return frame


def _text(column: pd.Series) -> bool:
    """Whether a column may hold text: object (mixed) or a string dtype; never a column of numbers or bools."""
    return pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column)
