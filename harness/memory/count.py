"""Counting a rank's bytes from live objects: tensors (each storage once), weights, gradients, optimizer state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Storage bytes of the tensors, each storage counted once (views and aliases share theirs)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of dicts, lists and tuples (an optimizer's or a compressor's state)."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, Mapping):
        return [t for v in state.values() for t in state_tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in state_tensors(v)]
    return []


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Measured: the bytes of the optimizer's state tensors."""
    return tensor_bytes(state_tensors(list(optimizer.state.values())))


def planned_optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Planned, before any step: the state the optimizer will create. SGD: a momentum buffer per parameter when
    momentum > 0; Adam and AdamW: two moments per parameter and a step counter (a 4-byte tensor) each."""
    total = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            size = p.numel() * p.element_size()
            if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                total += 2 * size + 4
            elif group.get("momentum", 0.0):
                total += size
    return total


def weight_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Parameters and buffers of the modules (each storage once)."""
    return tensor_bytes(t for m in modules for t in (*m.parameters(), *m.buffers()))


def gradient_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Planned: one gradient per trainable parameter."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for m in modules for p in m.parameters()
                                                     if p.requires_grad}.values())


def storages(modules: Iterable[torch.nn.Module]) -> set[int]:
    """The storage pointers of the modules' parameters and buffers (for SavedTensors' `exclude`)."""
    return {t.untyped_storage().data_ptr() for m in modules for t in (*m.parameters(), *m.buffers())}
