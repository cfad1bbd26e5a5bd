"""What every family that cuts a model's blocks shares: even splits, block shapes, the virtual-mode default, and
evaluation through a chain of ranks."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.comm.tags import Tag
from harness.data.tensors import TensorData

#: How many parts (stages, chunks) a multi-block method runs in the virtual mode (world size 1) unless told.
VIRTUAL_DEFAULT_PARTS = 2


def default_parts(requested: int | None, world_size: int) -> int:
    """The number of parts (pipeline stages, local chunks): as requested, else one per rank, or
    VIRTUAL_DEFAULT_PARTS in the virtual mode (world size 1: every part in one process)."""
    if requested is not None:
        return requested
    return world_size if world_size > 1 else VIRTUAL_DEFAULT_PARTS


def too_few(parts: int, kind: str, have: int, unit: str = "blocks") -> str:
    """The one-line reason a model of `have` `unit` cannot be cut into `parts` `kind` (stages, chunks)."""
    return f"{parts} {kind} need at least {parts} {unit}, but the workload's model has {have}"


@torch.no_grad()
def output_shapes(blocks: Sequence[nn.Module], example: torch.Tensor) -> list[tuple[int, ...]]:
    """The per-sample output shape (no batch dimension) of every block, from one eval-mode pass of `example`
    (a batch of at least one sample); the blocks' train/eval modes are left as they were."""
    shapes = []
    with eval_mode(blocks):
        h = example
        for block in blocks:
            h = block(h)
            shapes.append(tuple(h.shape[1:]))
    return shapes


@contextlib.contextmanager
def eval_mode(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Put `modules` in eval mode for the block, then back in the mode each was in."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


#: score(segment, its output h, labels y) -> a 1-D tensor of sums to accumulate for that segment, or None.
Score = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor | None]


@torch.no_grad()
def evaluate_chain(segments: Mapping[int, Callable[[torch.Tensor], torch.Tensor]], rank_of: Sequence[int],
                   input_shapes: Sequence[tuple[int, ...]], test: TensorData, comm: Communicator, batch_size: int,
                   device: torch.device, score: Score, width: int) -> torch.Tensor:
    """Pass the whole test set through a chain of segments spread over ranks, forward only. Collective.

    segments: this rank's segments, by index (segment i takes the output of segment i-1; segment 0 the inputs).
    rank_of[i]: the rank that holds segment i (one entry per segment of the chain).
    input_shapes[i]: the per-sample shape of segment i's input (i >= 1), for receive buffers.
    score(i, h, y): what segment i adds to its row of the totals, from its output h and the labels y (None: nothing).
    Returns totals: segments x width, float64, summed over the test set and all-reduced (category `eval`), the same on
    every rank. Activations go from rank to rank with tag EVAL_CHAIN, apart from training traffic; at most two sends
    are in flight per rank.
    """
    n = len(test)
    totals = torch.zeros(len(rank_of), width, dtype=torch.float64)
    pending: deque[tuple[torch.Tensor, object]] = deque()
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(n, start + batch_size))
        y = test.targets(idx).to(device)
        h: torch.Tensor | None = None
        for i in sorted(segments):
            if i == 0:
                h = test.inputs(idx).to(device)
            elif h is None:
                h = torch.empty((len(idx), *input_shapes[i]), device=device)
                comm.recv(h, rank_of[i - 1], "eval", Tag.EVAL_CHAIN)
            h = segments[i](h)
            scored = score(i, h, y)
            if scored is not None:
                totals[i] += scored.double().cpu()
            if i + 1 < len(rank_of) and rank_of[i + 1] != comm.rank:
                out = h.contiguous()
                pending.append((out, comm.isend(out, rank_of[i + 1], "eval", Tag.EVAL_CHAIN)))
                while len(pending) > 2:
                    pending.popleft()[1].wait()
                h = None
    while pending:
        pending.popleft()[1].wait()
    if comm.world_size > 1:
        comm.all_reduce(totals, "eval")  # each rank filled the rows of its own segments
    return totals


def classifier_sums(logits: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
    """[correct predictions, summed loss, predictions] of a batch of outputs, as float64: a Score's usual row. A
    classifier predicts one label per sample (logits N x C); a language model one next token per position (logits
    N x T x V, labels N x T), so its accuracy and loss are per token."""
    correct = (logits.argmax(dim=-1) == y).sum().double()
    count = torch.tensor(float(y.numel()), dtype=torch.float64, device=logits.device)
    return torch.stack([correct, loss_fn(logits, y, reduction="sum").double(), count])


#: The width of a classifier_sums row.
SUMS_WIDTH = 3
