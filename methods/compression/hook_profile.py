"""The compression hook profiled at planning time: the bytes it allocates and frees while it runs, and the scratch
buffers its compressor keeps, measured with the allocator on a fresh compressor and memory and a loop-back
communicator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.comm.communicator import Communicator
from harness.memory.passes import pass_peak
from harness.memory.peak import peak_of
from methods.compression.hook import CompressionHook


def _done(value: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut


class LoopbackComm(Communicator):
    """A communicator of the run's rank and world size without a process group, for profiling: an all-gather writes
    this rank's tensor into every rank's slot of the output (what the hook then decodes W times, as it decodes
    every rank's payload) through a staging buffer of the output's size, as gloo's all-gather holds one while it
    runs (measured on the CPU: c10d's _allgather_base_ and gloo's worker allocate one each, one after the other);
    an all-reduce leaves the tensor as it is (in place, as gloo's is; the hook's bytes do not depend on the values
    it sums or takes the maximum of). Futures are complete at once; nothing is counted in the run's ledger."""

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank, world_size, None)

    def all_reduce(self, tensor: torch.Tensor, category: str, op: dist.ReduceOp = dist.ReduceOp.SUM,
                   async_op: bool = False):
        return _done(tensor) if async_op else None

    def all_gather_into(self, output: torch.Tensor, tensor: torch.Tensor, category: str, async_op: bool = False):
        staging = torch.empty_like(output)
        staging.view(self.world_size, -1).copy_(tensor.reshape(1, -1).expand(self.world_size, -1))
        output.copy_(staging)
        return _done(output) if async_op else None


@dataclass
class _Bucket:
    """What CompressionHook reads of DDP's GradBucket: the flat gradient and its parameters, in the same order."""

    flat: torch.Tensor
    params: list[torch.nn.Parameter]

    def buffer(self) -> torch.Tensor:
        return self.flat

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.params


@dataclass
class HookProfile:
    """`peak`: the most bytes one call of the hook had allocated and not yet freed, from its start to its future's
    end (compensated gradients, payloads, the gathered buffer and its decoded rows, decompression's temporaries, a
    memory's new state made while the old is still held), on a step after the first; `scratch`: the bytes of the
    buffers the compressor reuses from call to call (allocated on the first step and kept)."""

    peak: int
    scratch: int


def sample_gradients(network: torch.nn.Module, loss: Callable[[], torch.Tensor],
                     device: torch.device) -> list[torch.Tensor]:
    """Copies of the gradients one forward and backward (`loss()` builds the loss) makes, in parameter order, the
    network's gradients, buffers and the RNG left as they were (pass_peak's profile, whose peak is not needed)."""
    grads: list[torch.Tensor] = []

    def run() -> None:
        loss().backward()
        grads.extend(p.grad.detach().clone() for p in network.parameters() if p.requires_grad)

    pass_peak(run, [network], device)
    return grads


def profile_hook(make_hook: Callable[[Communicator], CompressionHook], rank: int, world_size: int,
                 params: list[torch.nn.Parameter], grads: list[torch.Tensor], device: torch.device) -> HookProfile:
    """Run a fresh hook (`make_hook(communicator)`, with a compressor and a memory of its own) twice on one bucket
    holding `params` with gradients `grads`, through a LoopbackComm of this rank and world size: the first call
    makes the memory's state (residuals, momenta) and the compressor's scratch buffers, as the run's first step
    does; the second, the hook of a later step, is measured with the allocator. The global RNG is put back (the
    stochastic compressors draw from it)."""
    hook = make_hook(LoopbackComm(rank, world_size))
    flat = torch.cat([g.reshape(-1) for g in grads])
    first, second = flat.clone(), flat.clone()
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        # watched too (its peak unused): on the CPU the profiler knows the size of a block it saw allocated, so the
        # second call's replacing of the first's state (error feedback's residuals) is seen freed
        peak_of(lambda: hook(None, _Bucket(first, params)).wait(), device)
        peak = peak_of(lambda: hook(None, _Bucket(second, params)).wait(), device)
    return HookProfile(peak=peak, scratch=hook.compressor.scratch_bytes())
