"""PowerSGD's state per parameter, whatever DDP's bucket layout: torch's PowerSGDState keys its error and its P and
Q memories by bucket index, in the bucket's tensor order, and a fresh DDP (a resumed run) lays out its first step's
buckets differently from the rebuilt ones it had when the state was saved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The n x m matrix torch's hook views a gradient as: shape[0] rows."""
    n = int(shape[0]) if len(shape) else 1
    m = 1
    for d in shape[1:]:
        m *= int(d)
    return n, m


def compressed(shape: Sequence[int], rank: int, min_compression_rate: float) -> bool:
    """torch's _should_compress: (n + m)·r' · rate < n·m, with r' = min(n, m, rank)."""
    n, m = matrix_shape(shape)
    return (n + m) * min(n, m, rank) * min_compression_rate < n * m


def pq_slices(shapes: Sequence[Sequence[int]], rank: int, rate: float) -> dict[int, tuple[slice, slice]]:
    """Where each compressed tensor's P (n x r') and Q (m x r') sit in a bucket's P and Q memories: torch groups the
    compressed tensors by shape, groups in order of first appearance, tensors in bucket order within a group (one
    by one: batch_tensors_with_same_shape off). Keyed by the tensor's position in the bucket."""
    groups: dict[tuple, list[int]] = {}
    for i, shape in enumerate(shapes):
        if compressed(shape, rank, rate):
            groups.setdefault(matrix_shape(shape), []).append(i)
    out, p, q = {}, 0, 0
    for (n, m), members in groups.items():
        r = min(n, m, rank)
        for i in members:
            out[i] = (slice(p, p + n * r), slice(q, q + m * r))
            p, q = p + n * r, q + m * r
    return out


@dataclass
class ParameterState:
    """Error, P and Q per parameter name (P and Q only for compressed tensors that have them), and each bucket's
    layout as last seen: (names, shapes) in bucket order."""

    rank: int
    rate: float
    error: dict[str, torch.Tensor] = field(default_factory=dict)
    p: dict[str, torch.Tensor] = field(default_factory=dict)
    q: dict[str, torch.Tensor] = field(default_factory=dict)
    layouts: dict[int, tuple[list[str], list[tuple[int, ...]]]] = field(default_factory=dict)

    def take(self, state: PowerSGDState, keep: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """Move torch's per-bucket state into this one (per parameter), leaving torch's empty; with `keep`, copy it
        into the returned dicts instead (what this holds, plus torch's), touching neither. Returns the dicts."""
        out = {"error": dict(self.error), "p": dict(self.p), "q": dict(self.q)} if keep else \
            {"error": self.error, "p": self.p, "q": self.q}
        for index, (names, shapes) in self.layouts.items():
            if index in state.error_dict:
                offset = 0
                for name, shape in zip(names, shapes, strict=True):
                    numel = matrix_shape(shape)[0] * matrix_shape(shape)[1]
                    out["error"][name] = state.error_dict[index][offset:offset + numel].clone()
                    offset += numel
            if index in state.p_memory_dict:
                for i, (ps, qs) in pq_slices(shapes, self.rank, self.rate).items():
                    out["p"][names[i]] = state.p_memory_dict[index][ps].clone()
                    out["q"][names[i]] = state.q_memory_dict[index][qs].clone()
        if not keep:
            state.error_dict.clear()
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
            self.layouts.clear()
        return out

    def see(self, state: PowerSGDState, index: int, names: list[str], shapes: list[tuple[int, ...]]) -> None:
        """Before torch's hook runs on bucket `index`: if DDP laid the bucket out anew (its rebuild after the first
        step), move every bucket's state to per-parameter form first; then give this bucket what is held of its
        tensors."""
        if index in self.layouts and self.layouts[index][0] != names:
            self.take(state)
        if index not in self.layouts:
            self.give(state, index, names, shapes)
            self.layouts[index] = (names, shapes)

    def give(self, state: PowerSGDState, index: int, names: list[str], shapes: list[tuple[int, ...]]) -> None:
        """Lay out bucket `index`'s state in torch's form for these tensors, from what this holds of them (a
        tensor it holds nothing of starts as torch would: zero error; no P or Q memory unless every compressed
        tensor of the bucket has one, so that torch draws them all afresh)."""
        if any(name in self.error for name in names):
            parts = []
            for name, shape in zip(names, shapes, strict=True):
                n, m = matrix_shape(shape)
                parts.append(self.error.pop(name) if name in self.error else torch.zeros(n * m))
            state.error_dict[index] = torch.cat(parts)
        slices = pq_slices(shapes, self.rank, self.rate)
        if slices and all(names[i] in self.p for i in slices):
            state.p_memory_dict[index] = torch.cat([self.p.pop(names[i]) for i in slices])
            state.q_memory_dict[index] = torch.cat([self.q.pop(names[i]) for i in slices])

    def state_dict(self, state: PowerSGDState) -> dict[str, dict[str, torch.Tensor]]:
        """Error, P and Q per parameter name, torch's state untouched."""
        return self.take(state, keep=True)

    def load_state_dict(self, saved: dict) -> None:
        """Hold a saved state; each bucket gets its part when torch's hook first sees it (`see`)."""
        self.error, self.p, self.q = dict(saved["error"]), dict(saved["p"]), dict(saved["q"])
        self.layouts.clear()
