"""Microbatch views: what each stage of a step gets of the batch (inputs, labels, loss scales, sizes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from harness.data.tensors import Batch
from methods.pipeline.core.executor import Microbatches, Sizes


def split_sizes(samples: int, microbatches: int) -> list[int]:
    """The sizes of `samples` cut into consecutive microbatches, as torch.tensor_split cuts them."""
    return [len(part) for part in torch.tensor_split(torch.arange(samples), microbatches)]


def stage_views(batch: Batch | None, sizes: list[int], ids: list[int], iteration: int, stages: Iterable[int],
                last_stage: int, owns: Callable[[int, int], bool], device: torch.device, split: list[int]
                ) -> dict[int, Microbatches]:
    """Each of `stages`' view of a step's microbatches: consecutive slices of the batch of `sizes` samples,
    numbered `ids` in `iteration`. The first stage gets the inputs and the last the labels and loss scales (each
    microbatch's share of the batch), of the microbatches `owns(stage, mb)` says are held here. Microbatches of
    earlier steps have the sizes of a full minibatch's `split`; `batch` None: no new ones (a drain)."""
    keys = [(iteration, i) for i in ids]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    out = {}
    for s in stages:
        view = Microbatches(sizes=Sizes(dict(zip(keys, sizes, strict=True)), split))
        owned = [k for k, key in enumerate(keys) if owns(s, key[1])]
        if s == 0 and owned and batch is not None:
            x = batch.inputs().to(device)
            view.inputs = {keys[k]: x[starts[k]:starts[k] + sizes[k]] for k in owned}
        if s == last_stage and owned and batch is not None:
            y = batch.targets().to(device)
            view.targets = {keys[k]: y[starts[k]:starts[k] + sizes[k]] for k in owned}
            view.scales = {keys[k]: sizes[k] / len(batch) for k in owned}
        out[s] = view
    return out
