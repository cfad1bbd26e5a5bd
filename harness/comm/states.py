"""State passed between ranks without pickle: torch.save's format carried in a uint8 tensor by tensor collectives,
read back with torch.load(weights_only=True), as checkpoint files are.

torch.distributed's object collectives (gather_object, broadcast_object_list) unpickle whatever bytes arrive, so a
process that reaches a rank's connections could run code in it. These carry the same values (tensors, numbers,
strings, lists, dicts: what a checkpoint holds) through the same group, and a byte stream that is not such a value
fails to load instead of running.
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed as dist


def _device(group) -> torch.device:
    """Where the group's tensors must live: the current CUDA device under nccl, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def encode(value: Any) -> torch.Tensor:
    """`value` in torch.save's format, as a uint8 tensor."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def decode(data: torch.Tensor) -> Any:
    """The value encode() made; tensors, numbers, strings and containers only (weights_only)."""
    return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True)


def gather_states(value: Any, dst: int, group) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank `dst` (None elsewhere). Collective over `group`."""
    device = _device(group)
    data = encode(value).to(device)
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=device), group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    me = dist.get_rank(group)
    received = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)] if me == dst else None
    dist.gather(padded, received, dst=dist.get_global_rank(group, dst), group=group)
    if received is None:
        return None
    return [decode(r[:int(s.item())]) for r, s in zip(received, sizes, strict=True)]


def broadcast_state(value: Any, src: int, group) -> Any:
    """Rank `src`'s `value` on every rank (the others' `value` is ignored). Collective over `group`."""
    device = _device(group)
    me = dist.get_rank(group)
    data = encode(value).to(device) if me == src else None
    size = torch.tensor([data.numel() if data is not None else 0], dtype=torch.int64, device=device)
    root = dist.get_global_rank(group, src)
    dist.broadcast(size, root, group=group)
    if data is None:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, root, group=group)
    return value if me == src else decode(data)
