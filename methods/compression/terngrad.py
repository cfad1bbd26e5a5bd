"""TernGrad (Wen et al., NeurIPS 2017): stochastic ternary gradients {-s, 0, +s} with per-layer, shared scalers."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from pydantic import Field

from harness.comm.communicator import Communicator
from methods.bits import byte_codes, byte_codes_bytes, pack_bits_, round_up
from methods.compression.compressed_ddp import CompressedDDP, CompressionParams
from methods.compression.core import Compressed, Compressor
from methods.compression.packing import Scratch, flat_fp32

#: 2-bit codes: 0 -> 0, 1 -> +s, 2 -> -s (3 is never produced and decodes to 0).
CODE_VALUES = (0.0, 1.0, -1.0, 0.0)


class TernGradCompressor(Compressor):
    """Ternarize one layer's gradient g to s·sign(g)∘b, b_k ~ Bernoulli(|g_k|/s), sent as 2-bit codes and s.

    Scaler (per layer): s_local = min(max|g|, c·σ(g)), σ the population standard deviation and c = clip_c; with
    clip_c 0 or None, s_local = max|g|. With `share_scalers`, `prepare` all-reduces (MAX) the s_local of every layer
    of a bucket in one call, and every rank ternarizes with s = max over ranks. Entries with |g| > s become ±s (the
    clip); every other entry is ternarized without bias.

    Payload (the same layout in both modes, so it depends only on numel): ceil(n/4) bytes of codes packed 4 per
    byte in `pack_bits`'s layout, and s as one fp32. With sharing the scaler is redundant on the wire (every rank
    knows it), but its 4 bytes keep the count honest to the paper's "one scalar per layer" and make a payload
    decodable on its own; the scaler all-reduce itself is counted by the Communicator under `gradients`.
    """

    sums = False

    def __init__(self, clip_c: float | None = 2.5, share_scalers: bool = True):
        self.clip_c = clip_c
        self.share_scalers = share_scalers
        self._shared: dict[str, float] = {}  # name -> scaler agreed by prepare(), consumed by compress()
        self._scratch = Scratch()

    def scratch_bytes(self) -> int:
        """The scratch buffers, and the decoding's lookup table (byte_codes, cached from its first use on)."""
        return self._scratch.nbytes() + byte_codes_bytes(2)

    def local_scaler(self, grad: torch.Tensor) -> float:
        """s_local of one flat gradient, rounded to fp32 (the precision it travels in)."""
        low, high = torch.aminmax(grad)
        max_abs = max(-low.item(), high.item())
        scaler = max_abs
        if self.clip_c:
            # Population variance from two fused reductions (E[g²] - mean²); a gradient's mean is small next to
            # its spread, so the cancellation costs nothing here, at 2-3x the speed of torch.std.
            n = grad.numel()
            mean = grad.sum().item() / n
            variance = max(torch.linalg.vector_norm(grad).item() ** 2 / n - mean * mean, 0.0)
            # σ = 0 (a constant layer) clips everything to 0, as the reference's s = c·σ does.
            scaler = min(max_abs, self.clip_c * math.sqrt(variance))
        return torch.tensor(scaler, dtype=torch.float32).item()

    def prepare(self, named: list[tuple[str, torch.Tensor]], comm: Communicator) -> list[torch.Tensor] | None:
        """Scaler sharing: one all-reduce(MAX) of this bucket's per-layer scalers (returned: the hook retires them)."""
        self._shared = {}
        if not self.share_scalers or not named:
            return None
        scalers = torch.tensor([self.local_scaler(grad) for _, grad in named], dtype=torch.float32,
                               device=named[0][1].device)
        comm.all_reduce(scalers, "gradients", op=dist.ReduceOp.MAX)
        self._shared = dict(zip((name for name, _ in named), scalers.tolist(), strict=True))
        return [scalers]

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        grad = flat_fp32(tensor, "terngrad", name)
        scaler = self._shared.pop(name, None)
        if scaler is None:  # no sharing, or called outside a hook
            scaler = self.local_scaler(grad)
        codes = self._ternary_codes(grad, scaler)
        packed = pack_bits_(codes, 2)
        return Compressed([packed, torch.tensor([scaler], dtype=torch.float32, device=grad.device)],
                          ctx=grad.numel())

    def _ternary_codes(self, grad: torch.Tensor, scaler: float) -> torch.Tensor:
        """Codes (0, 1 = +s, 2 = -s) as uint8, zero-padded to a multiple of 4, in a reused scratch buffer.

        One uniform u_k ∈ [0, s) per element; the entry is kept iff u_k < |g_k|, so P = |g_k|/s (1 when clipped).
        The comparison runs on the fp32 bit patterns: after u <- copysign(u, g), u and g share their sign bit, and
        for two floats of one sign, |g| > |u| iff int32(g) > int32(u). No abs, no division, no fresh tensors.
        """
        n = grad.numel()
        uniform = self._scratch.take("uniform", n, torch.float32, grad.device)
        if scaler > 0:
            uniform.uniform_(0.0, scaler)
        else:
            uniform.zero_()
        uniform.copysign_(grad)
        codes = self._scratch.take("codes", round_up(n, 4), torch.uint8, grad.device)
        kept = codes[:n].view(torch.bool)
        torch.gt(grad.view(torch.int32), uniform.view(torch.int32), out=kept)
        negative = self._scratch.take("negative", n, torch.bool, grad.device)
        torch.signbit(grad, out=negative)
        codes[:n].bitwise_left_shift_(negative.view(torch.uint8))  # kept << negative: 0, 1 or 2
        codes[n:].zero_()
        return codes

    def decompress(self, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor:
        """A lookup of each packed byte in a 256 x 4 table of decoded values (4 codes per byte, scaled by s)."""
        packed, scaler = payload
        table = torch.tensor(CODE_VALUES, device=packed.device)[byte_codes(2, packed.device)] * scaler
        return torch.index_select(table, 0, packed.int()).view(-1)[:ctx]


class TernGradParams(CompressionParams):
    """TernGrad's options; each part of the algorithm can be switched off to measure its effect."""

    clip_c: float | None = Field(default=2.5, ge=0,
                                 description="clip at c·σ per layer (the paper's 2.5); 0 or null: s = max|g|")
    share_scalers: bool = Field(default=True, description="all ranks use the max of their per-layer scalers")
    compress_last_layer: bool = Field(default=False,
                                      description="ternarize the logits layer too (the paper sends it dense)")
    min_compress_numel: int = Field(default=256, ge=0,
                                    description="tensors with fewer elements are sent dense fp32 (biases, norms)")


class TernGrad(CompressedDDP):
    """TernGrad. On every worker i, per step, for each layer's local gradient g (a parameter tensor):

        s_i = min(max|g|, c·σ(g))                       c = clip_c (2.5); s_i = max|g| without clipping
        s   = max_i s_i                                 scaler sharing: one all-reduce(MAX) per DDP bucket
        b_k ~ Bernoulli(min(|g_k| / s, 1))              one uniform u_k ∈ [0, s) per element: b_k = [u_k < |g_k|]
        g̃   = s · sign(g) ∘ b                           E[g̃] = g where |g| ≤ s; |g_k| > s becomes ±s (the clip)
        send 2-bit codes of g̃ (4 per byte) and s (fp32) to all workers (all-gather)
        g   ← (1/W) Σ_i g̃_i ;   w ← momentum SGD(w, g)  (the run's lr, momentum, weight decay)

    The logits layer (the model's last block) and tensors under min_compress_numel elements are sent dense fp32.
    Reading of the clip: the reference code sets s = c·σ and clips to [-s, s]; we take min(max|g|, c·σ), which is
    the same whenever the clip bites and keeps s = max|g| (lower variance) when it would not. With sharing, the
    clip is at the shared s.
    """

    name = "terngrad"
    family = "data-parallel-compressed"
    summary = "TernGrad: stochastic ternary gradients, 2 bits per element, shared per-layer scalers"
    Params = TernGradParams

    def make_compressor(self) -> Compressor:
        return TernGradCompressor(self.ctx.params.clip_c, self.ctx.params.share_scalers)

    def dense_names(self) -> set[str]:
        dense = super().dense_names()
        if not self.ctx.params.compress_last_layer:
            logits = {id(p) for p in self.network[-1].parameters()}
            dense |= {n for n, p in self.network.named_parameters() if id(p) in logits}
        return dense
