"""Tensors in memory and the shared data order: every method sees the same samples in the same order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class TensorData:
    """A dataset held as tensors: inputs `x` (N x ...) and integer labels `y` (N).

    uint8 inputs are scaled to [0, 1] on load. `normalize`, if given, is a per-channel (mean, std) applied next.
    `transform`, if given, maps a batch of inputs and a torch.Generator to an augmented batch (training only).
    """

    x: torch.Tensor
    y: torch.Tensor
    transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"inputs and labels differ in length: {len(self.x)} vs {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def inputs(self, indices: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = self.x[indices]
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        if self.normalize is not None:
            mean, std = (torch.tensor(v, dtype=x.dtype).view(1, -1, *([1] * (x.dim() - 2))) for v in self.normalize)
            x = (x - mean) / std
        if self.transform is not None and generator is not None:
            x = self.transform(x, generator)
        return x

    def targets(self, indices: torch.Tensor) -> torch.Tensor:
        return self.y[indices]


class DataOrder:
    """The global order of training samples: a seeded permutation per epoch, cut into global batches.

    Step t of any method reads the same sample ids, given the seed and the global batch size. Incomplete last
    batches are dropped, so every step has exactly `batch_size` samples.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int):
        if batch_size > num_samples:
            raise ValueError(f"batch_size {batch_size} is larger than the training set ({num_samples} samples)")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = num_samples // batch_size
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.num_samples, generator=g)
            self._epoch = epoch
        return self._perm

    def batch(self, step: int) -> torch.Tensor:
        """Sample ids of global step `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.batch_size
        return self.permutation(epoch)[start:start + self.batch_size]

    def epoch_of(self, step: int) -> float:
        """Epochs completed after `step` steps."""
        return step / self.steps_per_epoch


@dataclass
class Batch:
    """One global training batch, handed to a method's train_step.

    A method loads only the parts it needs: data parallel ranks their shard, a pipeline's first stage the inputs
    and its last stage the labels. Augmentation is seeded by (seed, step), so it is the same for every method.
    """

    step: int
    epoch: float
    indices: torch.Tensor
    data: TensorData
    seed: int = 0

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 7_919 + self.step)

    def shard_indices(self, rank: int, world_size: int) -> torch.Tensor:
        """The contiguous slice of this batch that rank `rank` of `world_size` owns."""
        per = len(self.indices) // world_size
        return self.indices[rank * per:(rank + 1) * per]

    def inputs(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs of `indices` (default: the whole batch). Augmentation draws the same for a sample however sliced."""
        full = self.data.inputs(self.indices, self._generator())
        if indices is None:
            return full
        pos = _positions(self.indices, indices)
        return full[pos]

    def targets(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        return self.data.targets(self.indices if indices is None else indices)

    def shard(self, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) of this rank's shard."""
        idx = self.shard_indices(rank, world_size)
        if self.data.transform is None:
            return self.data.inputs(idx), self.data.targets(idx)
        return self.inputs(idx), self.targets(idx)

    def __len__(self) -> int:
        return len(self.indices)


def _positions(haystack: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    lookup = {int(v): i for i, v in enumerate(haystack.tolist())}
    return torch.tensor([lookup[int(v)] for v in needles.tolist()], dtype=torch.long)
