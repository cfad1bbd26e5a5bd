"""Point-to-point tags: every independent message stream between two ranks has its own tag, listed here once."""

from __future__ import annotations

from enum import IntEnum


class Tag(IntEnum):
    """Streams between the same two ranks are kept apart by tag (gloo matches a receive by source and tag, in order).

    CHANNEL_*: the bounded forward channel (harness/comm/channel.py): data, sample ids, credits back.
    EVAL_CHAIN: evaluation through a chain of ranks (methods/blocks.py), apart from training traffic.
    ACTIVATIONS, ACTIVATION_GRADS: a pipeline's stage-to-stage tensors (methods/pipeline/executor.py).
    """

    CHANNEL_DATA = 11
    CHANNEL_IDS = 12
    CHANNEL_CREDIT = 13
    EVAL_CHAIN = 21
    ACTIVATIONS = 31
    ACTIVATION_GRADS = 32
