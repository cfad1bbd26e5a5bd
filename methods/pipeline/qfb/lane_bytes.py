"""Q-FB's bytes beyond a one-lane pipeline's terms, profiled at plan time: the codecs' encode and decode transients,
2-Step GC's residuals, and each block's forward transient (what the forward lane allocates beside a backward)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from harness.memory import Footprint
from harness.memory.peak import peak_of
from harness.memory.profile import as_they_were
from methods.pipeline.core.codecs import Codec

#: The stream name of a plan-time profile's messages (a fresh codec: no run's stream is touched).
PROFILE_STREAM = "plan"


def codec_transient(make: Callable[[], Codec], numel: int, device: torch.device, decode: bool = False) -> int:
    """The allocator's peak while a fresh codec (`make()`) encodes an fp32 tensor of `numel` elements, or decodes
    its payload, less the result (the payload or the decoded tensor: a buffer of the walk's own). Profiled on the
    codec's second message of the stream, when what it keeps between messages exists (2-Step GC: the residual; the
    new one is made beside the old). The tensor is a deterministic ramp (no RNG draw); the sizes the codecs
    allocate depend on numel only."""
    if numel == 0:
        return 0
    codec = make()
    x = torch.linspace(-1.0, 1.0, numel, device=device)
    payload = codec.encode(x, PROFILE_STREAM)
    if decode:
        return max(0, peak_of(lambda: codec.decode(payload, (numel,)), device) - numel * x.element_size())
    return max(0, peak_of(lambda: codec.encode(x, PROFILE_STREAM), device) - payload.numel() * payload.element_size())


def forward_transients(blocks: list[nn.Module], example: torch.Tensor, loss: nn.Module, prints: list[Footprint]
                       ) -> list[int]:
    """Each block's forward transient on `example` fed through the chain (`loss` last; `prints` their footprints):
    the allocator's peak over the block's forward with autograd on (its input exists before it) less what the plan
    counts apart (its saved tensors and its output): the ops' intermediates that autograd does not keep. Buffers
    (BatchNorm's statistics) and the RNG are as they were on return."""
    chain = [*blocks, loss]
    with as_they_were(chain, example.device), torch.no_grad():  # every block's input, fed through the chain
        inputs = [example]
        for block in blocks:
            inputs.append(block(inputs[-1]))
    out: list[int] = []
    with as_they_were(chain, example.device), torch.enable_grad():
        for index, (block, fed, p) in enumerate(zip(chain, inputs, prints, strict=True)):
            x = fed.detach().requires_grad_(fed.is_floating_point() and index > 0)
            counted = p.saved_bytes + (0 if p.saves_output else p.output_bytes)
            out.append(max(0, peak_of(lambda block=block, x=x: block(x), example.device) - counted))
    return out


def stage_forward_transient(prints: list[Footprint], transients: list[int], a: int, b: int, last: bool) -> int:
    """What a stage's forward holds at its worst moment beyond what it holds once done (its saved tensors and its
    output, which the walk counts from the forward on): its worst block k's transient, with the block's input beside
    it where no block keeps that (an intermediate, freed once the block is done; the stage's first block's is the
    received message, a buffer of the walk's own), less what the blocks after k have not yet allocated then (their
    saved tensors, and the stage's output where the last block does not save it). Blocks [a, b), the loss's too on
    the last stage."""
    end = b + 1 if last else b
    out = 0
    for k in range(a, end):
        loose = 0 if k == a or prints[k].saves_input or prints[k - 1].saves_output else prints[k].input_bytes
        later = sum(prints[j].saved_bytes for j in range(k + 1, end))
        if k < end - 1 and not last and not prints[end - 1].saves_output:
            later += prints[end - 1].output_bytes
        out = max(out, transients[k] + loose - later)
    return out
