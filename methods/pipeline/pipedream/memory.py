"""PipeDream's stage bytes beyond the core's terms: a backward composed block by block as the first since the stage's
update (as each of PipeDream's is), and each minibatch's stash held from its forward to its backward."""

from __future__ import annotations

from torch import nn

from harness.memory import Footprint, chain_saved_bytes, gradient_bytes
from methods.pipeline.core.memory import modules_blocks


def first_backward_peak(prints: list[Footprint], transients: list[int], modules: list[nn.Module],
                        blocks: tuple[int, int], first: bool, last: bool) -> int:
    """The most bytes a stage's backward holds above what existed before it, when it is the first since the stage's
    update (no .grad yet: autograd keeps each new gradient as the .grad), from its blocks' profiles (`prints`, and
    `transients` profiled as a first backward runs: backward_transients(accumulate=False)): walking blocks [a, b)
    from the last, block k's backward holds the gradients of blocks k..b-1 (made and kept), its own transient and
    its output's gradient, while the blocks after it have let go of their saved tensors (autograd frees them as
    each block's backward ends; a stage keeps only weak references to them, core/stage.py). On the last stage the
    loss's backward comes first. The stage's input gradient (in its first block's transient) is left out after the
    `first` stage: the walk holds it as the send's buffer (StageTerms.grad_input). `modules`: the stage's module
    (an nn.Sequential of its blocks) or its blocks."""
    a, b = blocks
    grads = [gradient_bytes([m]) for m in modules_blocks(modules)]
    if len(grads) != b - a:
        raise ValueError(f"blocks [{a}, {b}) but {len(grads)} modules")
    peak = transients[b] if last else 0
    made = 0
    freed = chain_saved_bytes(prints, b, b + 1) if last else 0
    for k in reversed(range(a, b)):
        made += grads[k - a]
        incoming = prints[k].output_bytes if last or k < b - 1 else 0
        sent = prints[a].input_bytes if k == a and not first else 0  # the input's gradient: the walk's grad_input
        peak = max(peak, made + transients[k] - sent + incoming - freed)
        freed += chain_saved_bytes(prints, k, k + 1)
    return peak
