"""Local parallelism's parts: how a block list is cut into chunks, and the auxiliary heads."""

from __future__ import annotations

from torch import nn

from harness.split import uniform_split


def chunk_ranges(num_blocks: int, chunks: int, variant: str) -> list[tuple[int, int]]:
    """[start, end) block ranges of each chunk, in order.

    chunked: `chunks` contiguous, disjoint ranges, sizes as equal as possible (earlier chunks take the remainder).
    greedy: one block per chunk (`chunks` is ignored).
    overlapping: like chunked over the blocks, then every chunk after the first also starts one block earlier, so
    consecutive chunks share a block (the shared block is trained by both chunks' losses; chunk c+1's input is the
    shared block's input, see path_ranges).
    """
    if variant == "greedy":
        return [(b, b + 1) for b in range(num_blocks)]
    if not 1 <= chunks <= num_blocks:
        raise ValueError(f"cannot cut {num_blocks} blocks into {chunks} chunks")
    ranges = uniform_split(num_blocks, chunks)
    if variant == "overlapping":
        ranges = [ranges[0]] + [(s - 1, e) for s, e in ranges[1:]]
    elif variant != "chunked":
        raise ValueError(f"unknown variant {variant!r} (chunked, greedy, overlapping)")
    return ranges


def path_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The network path through chunks of `ranges`: segment c is chunk c's blocks that chunk c-1 does not hold, so
    every block appears once, in order, and segment c ends with chunk c's last block (its head's input). Disjoint
    chunks are their own path; for overlapping ones, chunk c+1's shared first block runs in segment c, and chunk c+1
    continues from its output."""
    return [(ranges[0][0] if c == 0 else ranges[c - 1][1], end) for c, (_, end) in enumerate(ranges)]


def make_head(kind: str, feature_shape: tuple[int, ...], classes: int, hidden: int = 128) -> nn.Module:
    """An auxiliary classifier for features of `feature_shape` (without the batch dimension).

    auto: `dgl` for feature maps (C, H, W), `lm` for a sequence of vectors (T, D), `linear` for vectors.
    dgl: Decoupled Greedy Learning's head (Belilovsky et al. 2020): average-pool (when the map is 8x8 or larger),
        1x1 conv + BatchNorm + ReLU, average-pool to 2x2, linear.
    linear: a linear classifier on the flattened features. mlp: Linear(hidden) + ReLU + Linear.
    lm: a language model's head at every position, LayerNorm(D) then a linear map to the vocabulary (`classes`), as
        the final head of a GPT: Local Parallelism's language models (Laskin et al. 2020) give each chunk one.
    """
    if kind == "auto":
        kind = {3: "dgl", 2: "lm"}.get(len(feature_shape), "linear")
    if kind == "lm":
        if len(feature_shape) != 2:
            raise ValueError(f"the lm head needs (positions, features) inputs, got features of shape {feature_shape}")
        return nn.Sequential(nn.LayerNorm(feature_shape[1]), nn.Linear(feature_shape[1], classes))
    if kind == "dgl":
        if len(feature_shape) != 3:
            raise ValueError(f"the dgl head needs (C, H, W) feature maps, got features of shape {feature_shape}")
        c, h, _ = feature_shape
        return nn.Sequential(nn.AvgPool2d(2) if h >= 8 else nn.Identity(), nn.Conv2d(c, c, 1), nn.BatchNorm2d(c),
                             nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * c, classes))
    width = 1
    for d in feature_shape:
        width *= d
    if kind == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(width, classes))
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    raise ValueError(f"unknown head {kind!r} (auto, dgl, linear, mlp)")
