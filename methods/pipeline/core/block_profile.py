"""Per-block profiles for PipeDream's partitioner: forward and backward time, output activation and parameter bytes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class BlockProfile:
    """What PipeDream's profiler records for one layer l (Narayanan et al., SOSP 2019, section 3.1).

    forward_s + backward_s is the paper's T_l, activation_bytes its a_l (the output activation sent to the next stage,
    and its gradient sent back), and param_bytes its |w_l| (what replicas of a stage must synchronise).
    """

    forward_s: float  # seconds for the block's forward on the example batch (median of repeats)
    backward_s: float  # seconds for its backward (grad wrt its input and its params), median of repeats
    activation_bytes: int  # bytes of the block's output tensor for the example batch
    param_bytes: int  # bytes of the block's parameters

    @property
    def compute_s(self) -> float:
        """Forward plus backward time: the paper's T_l."""
        return self.forward_s + self.backward_s


def profile_blocks(
    blocks: Sequence[nn.Module], example: torch.Tensor, repeats: int = 5, warmup: int = 1
) -> list[BlockProfile]:
    """Profile each block in order, feeding `example` through the chain as in a single-worker training step.

    Each block's input is the previous block's output, detached and (when floating point) requiring grad, so the timed
    backward computes the gradient wrt the input (what a stage sends back) as well as wrt the parameters. A repeat
    times one forward, then one backward with an all-ones output gradient; the median of `repeats` runs (after
    `warmup` untimed ones) is kept. Gradients come from torch.autograd.grad, so no .grad is written; the blocks'
    parameters, buffers (e.g. BatchNorm running stats) and the RNG state (dropout) are as they were on return.
    The thread count is the caller's: set it (e.g. torch.set_num_threads(1)) before profiling for stable numbers.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    if len(blocks) == 0:
        raise ValueError("no blocks to profile")
    profiles: list[BlockProfile] = []
    x = example
    rng_devices = [example.device.index or 0] if example.is_cuda else []
    with torch.random.fork_rng(devices=rng_devices), torch.enable_grad():
        for index, block in enumerate(blocks):
            saved_buffers = [buffer.detach().clone() for buffer in block.buffers()]
            x = x.detach()
            if x.is_floating_point():
                x.requires_grad_(True)
            forward_times, backward_times, out = [], [], None
            for run in range(warmup + repeats):
                forward_s, backward_s, out = _time_step(block, x)
                if run >= warmup:
                    forward_times.append(forward_s)
                    backward_times.append(backward_s)
            with torch.no_grad():
                for buffer, saved in zip(block.buffers(), saved_buffers, strict=True):
                    buffer.copy_(saved)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"block {index} returned {type(out).__name__}; the partitioner needs one tensor")
            profiles.append(
                BlockProfile(
                    forward_s=statistics.median(forward_times),
                    backward_s=statistics.median(backward_times),
                    activation_bytes=out.numel() * out.element_size(),
                    param_bytes=sum(p.numel() * p.element_size() for p in block.parameters()),
                )
            )
            x = out
    return profiles


def _time_step(block: nn.Module, x: torch.Tensor) -> tuple[float, float, torch.Tensor]:
    """One timed forward and backward of `block` on `x`; returns (forward seconds, backward seconds, output)."""
    _synchronize(x)
    start = time.perf_counter()
    out = block(x)
    _synchronize(x)
    forward_end = time.perf_counter()
    backward_s = 0.0
    if isinstance(out, torch.Tensor) and out.requires_grad:
        inputs = [x] if x.requires_grad else []
        inputs += [p for p in block.parameters() if p.requires_grad]
        torch.autograd.grad(out, inputs, grad_outputs=torch.ones_like(out), allow_unused=True)
        _synchronize(x)
        backward_s = time.perf_counter() - forward_end
    return forward_end - start, backward_s, out.detach() if isinstance(out, torch.Tensor) else out


def _synchronize(x: torch.Tensor) -> None:
    """Wait for queued device work, so perf_counter brackets it (a no-op on CPU)."""
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def profiles_to_dicts(profiles: Sequence[BlockProfile]) -> list[dict[str, float | int]]:
    """Plain dicts (one per block, in order) for JSON."""
    return [asdict(profile) for profile in profiles]


def profiles_from_dicts(rows: Sequence[dict[str, float | int]]) -> list[BlockProfile]:
    """The inverse of profiles_to_dicts; a row with missing or unknown keys raises ValueError naming them."""
    expected = {"forward_s", "backward_s", "activation_bytes", "param_bytes"}
    profiles = []
    for index, row in enumerate(rows):
        if set(row) != expected:
            raise ValueError(
                f"profile row {index}: missing {sorted(expected - set(row))}, unknown {sorted(set(row) - expected)}"
            )
        profiles.append(
            BlockProfile(
                forward_s=float(row["forward_s"]),
                backward_s=float(row["backward_s"]),
                activation_bytes=int(row["activation_bytes"]),
                param_bytes=int(row["param_bytes"]),
            )
        )
    return profiles
