"""Profiling a chain of blocks on one microbatch: each block's saved bytes (Footprint), and a range's sum."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.memory.count import storages
from harness.memory.saved import SavedTensors, saved_bytes


@dataclass(frozen=True)
class Footprint:
    """One block of a chain, profiled on a microbatch: the bytes autograd saves for its backward besides its input
    (its weights excluded), whether it saves its input and its output, and their bytes."""

    saved_bytes: int
    saves_input: bool
    saves_output: bool
    input_bytes: int
    output_bytes: int


class LossBlock(torch.nn.Module):
    """The loss as the chain's last block (its saved tensors count: a cross-entropy keeps its log-probabilities)."""

    def __init__(self, loss_fn: Any, targets: torch.Tensor):
        super().__init__()
        self.loss_fn, self.targets = loss_fn, targets

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(h, self.targets)


@contextlib.contextmanager
def as_they_were(modules: Iterable[torch.nn.Module], device: torch.device) -> Iterator[None]:
    """Around a profile at planning time: the modules' buffers (BatchNorm's running statistics) and the RNG (dropout
    draws) as they were, on the way out."""
    modules = list(modules)
    devices = [device.index or 0] if device.type == "cuda" else []
    kept = [[b.detach().clone() for b in m.buffers()] for m in modules]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for m, values in zip(modules, kept, strict=True):
                for buffer, value in zip(m.buffers(), values, strict=True):
                    buffer.copy_(value)


def footprints(blocks: Iterable[torch.nn.Module], example: torch.Tensor, detach_inputs: bool = False
               ) -> list[Footprint]:
    """Each block's Footprint on `example` fed through the chain (one forward with autograd on, no backward). With
    `detach_inputs` every block after the first starts from a detached input that requires grad, as a pipeline
    stage receives it. Weights, buffers (BatchNorm's statistics) and the RNG (dropout) are as they were on return."""
    blocks = list(blocks)
    out: list[Footprint] = []
    graph = []  # every block's output, kept until the end: a block's saved tensors stay alive as in a training step
    try:
        with as_they_were(blocks, example.device), torch.enable_grad():
            x = example
            for index, block in enumerate(blocks):
                if index and detach_inputs and x.is_floating_point():
                    x = x.detach().requires_grad_(True)
                entry = x.untyped_storage().data_ptr()
                counter = SavedTensors(exclude=storages([block]) | {entry})
                with counter:
                    y = block(x)
                exit_ = y.untyped_storage().data_ptr()
                out.append(Footprint(counter.peak, entry in counter.touched, exit_ in counter.keys(),
                                     saved_bytes(x), saved_bytes(y)))
                graph.append((counter, y))
                x = y
    finally:
        for counter, _ in graph:  # the profile's graph never runs backward: let it go (SavedTensors.drop)
            counter.drop()
    return out


def chain_saved_bytes(prints: list[Footprint], start: int, end: int) -> int:
    """The bytes blocks [start, end) of a profiled chain save for one microbatch's backward, run as one module: each
    block's own, its input where it saves it, a storage two neighbours both save counted once."""
    total = 0
    for i in range(start, end):
        p = prints[i]
        total += p.saved_bytes
        if p.saves_input and (i == start or not prints[i - 1].saves_output):
            total += p.input_bytes
    return total
