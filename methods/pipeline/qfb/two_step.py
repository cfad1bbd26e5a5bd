"""2-Step GC, Q-FB's gradient codec as read here: top-k with error feedback, then int8 of the kept values."""

from __future__ import annotations

import math
from typing import Any

import torch

from methods.bits import pack_bits, unpack_bits
from methods.pipeline.core.codecs import Codec

SCALE_BYTES = 4  # one fp32 scale per message
LEVELS = 127  # int8 codes in [-127, 127], sent as code + 127


def index_width(numel: int) -> int:
    """Bytes of one index in a message of `numel` elements: the narrowest unsigned width that holds numel - 1."""
    return 1 if numel <= 2**8 else 2 if numel <= 2**16 else 4 if numel <= 2**32 else 8


class TwoStep(Codec):
    """Q-FB's "2-Step GC" for the gradients sent backward between stages. The paper names the algorithm and nothing
    more (only its abstract is public), so this is a **reading**:

    step 0 (error feedback): a = g + r, where r is what earlier messages of the same stream did not deliver;
    step 1 (sparsify): keep the k = max(1, ceil(density · n)) entries of a largest in magnitude (all of them when
        density = 1), at indices I in increasing order;
    step 2 (quantize): s = max_{i in I} |a_i|, codes q_i = round(a_i / s · 127) in [-127, 127] (round half to even);
    the receiver gets ĝ_i = q_i · s / 127 on I and 0 elsewhere, and the sender keeps r ← a − ĝ. So the sent tensor
    plus the residual is the accumulated gradient: ĝ + r = g + r_before (exactly, up to one fp32 rounding).

    Payload of a message of n elements (the size depends on n only, so a receive is posted ahead):
        [scale: 4 bytes fp32][indices][codes: k bytes, q + 127 as uint8]
    where the indices are a bitmap of ceil(n/8) bytes or a list of k indices of `index_width(n)` bytes each
    (little end first), whichever is smaller, and nothing when k = n.

    Streams: the residual is kept per `stream` (kind, sending stage, source rank, destination rank) and message size,
    so it carries over from one microbatch's message to the next one's on the same link. `feedback = False` drops r
    (plain top-k + int8, for the ablation).
    """

    name = "2step"

    def __init__(self, density: float = 0.1, feedback: bool = True):
        if not 0.0 < density <= 1.0:
            raise ValueError(f"2-Step GC density must be in (0, 1], got {density}")
        self.density, self.feedback = density, feedback
        self.residuals: dict[str, torch.Tensor] = {}

    # -- layout ---------------------------------------------------------------------------------------------------
    def kept(self, numel: int) -> int:
        """k: the entries a message of `numel` elements carries."""
        return 0 if numel == 0 else min(numel, max(1, math.ceil(self.density * numel)))

    def uses_bitmap(self, numel: int) -> bool:
        """Whether the indices travel as a bitmap (else as a list; neither when every entry is kept)."""
        k = self.kept(numel)
        return k < numel and math.ceil(numel / 8) < k * index_width(numel)

    def index_bytes(self, numel: int) -> int:
        k = self.kept(numel)
        if k == numel:
            return 0
        return math.ceil(numel / 8) if self.uses_bitmap(numel) else k * index_width(numel)

    def nbytes(self, numel: int) -> int:
        return SCALE_BYTES + self.index_bytes(numel) + self.kept(numel)

    # -- encode and decode ------------------------------------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, stream: Any = None) -> torch.Tensor:
        grad = tensor.detach().float().reshape(-1)
        n = grad.numel()
        key = f"{stream}|{n}"
        residual = self.residuals.get(key)
        accumulated = grad + residual if residual is not None and self.feedback else grad.clone()
        k = self.kept(n)
        if k == n:
            indices = torch.arange(n)
        else:
            indices = torch.topk(accumulated.abs(), k, sorted=False).indices.sort().values
        values = accumulated[indices]
        scale = values.abs().max() if k else torch.zeros(())
        if scale > 0:
            codes = torch.round(values * (LEVELS / scale)).clamp_(-LEVELS, LEVELS)
        else:
            codes = torch.zeros_like(values)
        if self.feedback:
            accumulated[indices] -= codes * (scale / LEVELS)
            self.residuals[key] = accumulated
        return torch.cat([scale.float().reshape(1).view(torch.uint8), self._index_payload(indices, n),
                          (codes + LEVELS).to(torch.uint8)])

    def _index_payload(self, indices: torch.Tensor, numel: int) -> torch.Tensor:
        if indices.numel() == numel:
            return torch.zeros(0, dtype=torch.uint8)
        if self.uses_bitmap(numel):
            mask = torch.zeros(numel, dtype=torch.uint8)
            mask[indices] = 1
            return pack_bits(mask, 1)
        shifts = 8 * torch.arange(index_width(numel), dtype=torch.int64)
        return ((indices.unsqueeze(1) >> shifts) & 0xFF).to(torch.uint8).reshape(-1)

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        n = math.prod(shape)
        k, index_bytes = self.kept(n), self.index_bytes(n)
        scale = payload[:SCALE_BYTES].clone().view(torch.float32)
        section = payload[SCALE_BYTES:SCALE_BYTES + index_bytes]
        if k == n:
            indices = torch.arange(n)
        elif self.uses_bitmap(n):
            indices = unpack_bits(section, 1, n).nonzero().reshape(-1)
        else:
            width = index_width(n)
            shifts = 8 * torch.arange(width, dtype=torch.int64)
            indices = (section.reshape(k, width).to(torch.int64) << shifts).sum(dim=1)
        codes = payload[SCALE_BYTES + index_bytes:].float() - LEVELS
        out = torch.zeros(n)
        out[indices] = codes * (scale / LEVELS)
        return out.view(shape)

    def error_bound(self, tensor: torch.Tensor) -> float:
        """A dropped entry loses its whole value, a kept one at most s/254: max|x| bounds both (stateless use)."""
        return float(tensor.abs().max()) if tensor.numel() else 0.0

    # -- state: the residuals of error feedback ------------------------------------------------------------------
    def residual(self, stream: Any, numel: int) -> torch.Tensor | None:
        """What the stream has not delivered yet, for messages of `numel` elements (None before its first)."""
        return self.residuals.get(f"{stream}|{numel}")

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": {key: r.clone() for key, r in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = {key: r.clone() for key, r in state.get("residuals", {}).items()}
