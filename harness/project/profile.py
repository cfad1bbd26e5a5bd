"""Block costs of a workload's model at several batch sizes, measured in this process, and their interpolation to
the per-rank (or per-microbatch) batch that a world size implies."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from pydantic import TypeAdapter
from torch import nn


@dataclass(frozen=True)
class BlockCosts:
    """Per-block costs of one model, measured at several batch sizes.

    batch_sizes: ascending (sizes); forward_s, backward_s: sizes x blocks, seconds (least of repeats);
    activation_bytes: blocks, the bytes of a block's output per sample; param_bytes: blocks x parameters, each
    parameter's bytes in registration order; optimizer_s: one SGD step over all parameters.
    """

    batch_sizes: tuple[int, ...]
    forward_s: tuple[tuple[float, ...], ...]
    backward_s: tuple[tuple[float, ...], ...]
    activation_bytes: tuple[float, ...]
    param_bytes: tuple[tuple[int, ...], ...]
    optimizer_s: float

    @property
    def blocks(self) -> int:
        return len(self.activation_bytes)

    def at(self, batch: float) -> tuple[list[float], list[float], bool]:
        """(forward_s per block, backward_s per block, extrapolated) at `batch` samples: piecewise linear in the
        batch between the measured sizes; outside them, the line through the two nearest sizes (extrapolated is
        True then), never below zero."""
        sizes = np.asarray(self.batch_sizes, dtype=float)
        outside = batch < sizes[0] or batch > sizes[-1]
        return (interpolate(sizes, np.asarray(self.forward_s), batch),
                interpolate(sizes, np.asarray(self.backward_s), batch), bool(outside and len(sizes) > 1))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlockCosts:
        """to_dict's JSON read back, its lists as the fields' tuples of ints and floats."""
        return TypeAdapter(cls).validate_python(data)


def interpolate(sizes: np.ndarray, values: np.ndarray, batch: float) -> list[float]:
    """values (sizes x blocks) at `batch`: linear between neighbours, linear from the two nearest outside."""
    if len(sizes) == 1:
        return [float(v) * batch / sizes[0] for v in values[0]]
    i = int(np.clip(np.searchsorted(sizes, batch) - 1, 0, len(sizes) - 2))
    weight = (batch - sizes[i]) / (sizes[i + 1] - sizes[i])
    return [max(0.0, float(a + weight * (b - a))) for a, b in zip(values[i], values[i + 1], strict=True)]


def default_batch_sizes(largest: int, exact: Sequence[int] = ()) -> list[int]:
    """Powers of two from 1 up to `largest`, `largest` itself, and the `exact` sizes runs used."""
    sizes = {1 << k for k in range(max(1, int(largest)).bit_length()) if 1 << k <= largest}
    return sorted(sizes | {int(largest)} | {int(b) for b in exact if b >= 1})


def profile_model(blocks: Sequence[nn.Module], inputs: torch.Tensor, batch_sizes: Sequence[int],
                  momentum: float = 0.9, repeats: int = 15, warmup: int = 2) -> BlockCosts:
    """Measure each block's forward and backward (gradients w.r.t. its input and parameters, with an all-ones output
    gradient, as a pipeline stage runs it) at every batch size, feeding the chain as one training step does; the
    least of `repeats` after `warmup` (the least disturbed reading: what other processes add in a run is the
    calibration's scale). Then one SGD step (with `momentum`) over all parameters. The caller sets the
    thread count (the runs' threads per rank). Parameters and buffers are restored; gradients are not written."""
    forward, backward, activation = [], [], [0.0] * len(blocks)
    saved = [{k: v.detach().clone() for k, v in block.state_dict().items()} for block in blocks]
    with torch.random.fork_rng(), torch.enable_grad():
        for size in batch_sizes:
            x = inputs[torch.arange(size) % len(inputs)]
            row_f, row_b = [], []
            for index, block in enumerate(blocks):
                x = x.detach().requires_grad_(x.is_floating_point())
                times = [time_block(block, x) for _ in range(warmup + repeats)][warmup:]
                row_f.append(min(t[0] for t in times))
                row_b.append(min(t[1] for t in times))
                with torch.no_grad():
                    x = block(x)
                activation[index] = x.numel() * x.element_size() / size
            forward.append(tuple(row_f))
            backward.append(tuple(row_b))
    for block, state in zip(blocks, saved, strict=True):
        block.load_state_dict(state)
    params = [p for block in blocks for p in block.parameters()]
    return BlockCosts(tuple(int(b) for b in batch_sizes), tuple(forward), tuple(backward), tuple(activation),
                      tuple(tuple(p.numel() * p.element_size() for p in block.parameters()) for block in blocks),
                      optimizer_seconds(params, momentum, repeats, warmup))


def time_block(block: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one block on x."""
    start = time.perf_counter()
    out = block(x)
    middle = time.perf_counter()
    inputs = ([x] if x.requires_grad else []) + [p for p in block.parameters() if p.requires_grad]
    if inputs and out.requires_grad:
        torch.autograd.grad(out, inputs, grad_outputs=torch.ones_like(out), allow_unused=True)
    return middle - start, time.perf_counter() - middle


def optimizer_seconds(params: Sequence[torch.Tensor], momentum: float, repeats: int, warmup: int) -> float:
    """The least seconds of one torch.optim.SGD step (lr 0, so the parameters do not move) over copies of params."""
    if not params:
        return 0.0
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    for p in copies:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.SGD(copies, lr=0.0, momentum=momentum)
    times = []
    for _ in range(warmup + repeats):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return min(times[warmup:])


def profile_workload(workload: str, options: dict[str, Any], batch_sizes: Sequence[int], threads: int,
                     momentum: float = 0.9, data_root: str | None = None) -> BlockCosts:
    """Build the workload's model (with seed 0) and profile it on its training inputs with `threads` threads."""
    from harness import registry

    instance = registry.WORKLOADS.get(workload).instantiate(options, data_root)
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = instance.make_model()
        inputs = instance.train.inputs(torch.arange(min(len(instance.train), max(batch_sizes))))
        return profile_model(list(model), inputs, batch_sizes, momentum)
    finally:
        torch.set_num_threads(previous)
