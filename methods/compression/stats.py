"""Per-step compression statistics of one rank: time in each phase, dense and payload bytes, and their ratio."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


def bytes_record(dense_bytes: int, payload_bytes: int) -> dict[str, Any]:
    """The byte fields of a train record: dense_bytes (what fp32 gradients of the same tensors would be),
    payload_bytes (what this rank handed to the collective) and compression_ratio = dense / payload, which is None
    (null in metrics.jsonl) when nothing was sent: no ratio was measured."""
    ratio = dense_bytes / payload_bytes if payload_bytes else None
    return {"dense_bytes": dense_bytes, "payload_bytes": payload_bytes, "compression_ratio": ratio}


@dataclass
class CompressionStats:
    """Per-step counters of one rank (summed over the step's buckets)."""

    compress_s: float = 0.0
    communicate_s: float = 0.0
    decompress_s: float = 0.0
    dense_bytes: int = 0
    payload_bytes: int = 0

    def pop(self) -> dict[str, Any]:
        """The counters as a train-record dict (bytes_record's fields included), reset to zero."""
        out = {"compress_s": self.compress_s, "communicate_s": self.communicate_s, "decompress_s": self.decompress_s,
               **bytes_record(self.dense_bytes, self.payload_bytes)}
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())
        return out
