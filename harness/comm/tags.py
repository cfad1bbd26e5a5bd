"""Point-to-point tags: every independent message stream between two ranks has its own tag, listed here once."""

from __future__ import annotations

from enum import IntEnum


class Tag(IntEnum):
    """Streams between the same two ranks are kept apart by tag (gloo matches a receive by source and tag, in order).

    CHANNEL_*: the bounded forward channel (harness/comm/channel.py): data, sample ids, credits back.
    EVAL_CHAIN: evaluation through a chain of ranks (methods/blocks.py), apart from training traffic.
    BANDWIDTH_PROBE: the link measurement before a run (methods/pipeline/apapo/hardware.py).
    ACTIVATIONS, ACTIVATION_GRADS: a pipeline's stage-to-stage tensors (methods/pipeline/core/executor.py): the stream
    across the boundary between stages b and b+1 has tag pipeline_tag(kind, b), so that two stages of one rank that
    talk to the same peer (interleaved schedules) keep their streams apart.
    """

    CHANNEL_DATA = 11
    CHANNEL_IDS = 12
    CHANNEL_CREDIT = 13
    EVAL_CHAIN = 21
    BANDWIDTH_PROBE = 31
    ACTIVATIONS = 1000
    ACTIVATION_GRADS = 2000


def pipeline_tag(kind: str, boundary: int) -> int:
    """The tag of a pipeline stream: activations ('act') or activation gradients ('grad') across the boundary between
    stages `boundary` and `boundary` + 1 (below 1000 boundaries)."""
    if not 0 <= boundary < 1000:
        raise ValueError(f"pipeline boundary {boundary} out of range 0..999")
    return (Tag.ACTIVATIONS if kind == "act" else Tag.ACTIVATION_GRADS) + boundary
