"""Byte counts read and written: memory_per_rank's '48MB' to 48000000, and back for messages and run ids."""

from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_TEXT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """A byte count from an integer or a string with a decimal or binary unit: 48000000, '48MB', '1.5 GiB'."""
    if isinstance(value, bool):
        raise ValueError("expected bytes: an integer or a string such as '48MB'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value
    match = _TEXT.match(value) if isinstance(value, str) else None
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"expected bytes: an integer or a number with a unit (B, KB, MB, GB, KiB, MiB, GiB), "
                         f"such as '48MB', got {value!r}")
    count = int(float(match.group(1)) * _UNITS[unit])
    if count <= 0:
        raise ValueError(f"must be positive, got {value!r}")
    return count


def format_bytes(count: float) -> str:
    """'48.0 MB' (decimal units, as memory_per_rank = '48MB' reads); 'inf GB' for an overflowed count, and '–' (a
    blank) for NaN, the mean of a corrupt record's inf and -inf."""
    if count != count:  # NaN
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def memory_text(count: int) -> str:
    """A byte count as a run id shows it: 48000000 -> '48MB', 67108864 -> '64MiB', else the count."""
    for unit, size in (("GB", 10**9), ("GiB", 2**30), ("MB", 10**6), ("MiB", 2**20), ("KB", 10**3), ("KiB", 2**10)):
        if count % size == 0:
            return f"{count // size}{unit}"
    return str(count)
