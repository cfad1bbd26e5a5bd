"""The even split of a model's blocks into contiguous parts (pipelines, Local Parallelism, the projection)."""

from __future__ import annotations


def uniform_split(num_blocks: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [start, end) ranges of sizes as equal as possible; earlier parts take the extra blocks."""
    if not 1 <= parts <= num_blocks:
        raise ValueError(f"cannot cut {num_blocks} blocks into {parts} parts (need 1 <= parts <= blocks)")
    base, extra = divmod(num_blocks, parts)
    ranges, start = [], 0
    for index in range(parts):
        end = start + base + (1 if index < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges
