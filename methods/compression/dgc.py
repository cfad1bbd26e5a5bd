"""Deep Gradient Compression (Lin et al., ICLR 2018): momentum-corrected, warmed-up top-k gradient sparsification."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field, model_validator

from harness.comm.communicator import Communicator
from harness.data.tensors import Batch
from harness.method import RunContext, StepStats
from methods.compression.compressed_ddp import CompressedDDP, CompressionParams
from methods.compression.core import Compressed, Compressor, Memory
from methods.compression.hook import CompressionHook

#: Warm-up densities (the paper's sparsities 75%, 93.75%, 98.4375%, 99.6%, 99.9%), equal shares of the warm-up.
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004, 0.001)

#: Block size of the pre-filter that skips blocks holding no candidate (used at densities up to BLOCK_MAX_DENSITY).
BLOCK = 32
BLOCK_MAX_DENSITY = 0.01


def density_at(epoch: float, warmup_epochs: float, final_density: float) -> float:
    """The fraction of a tensor sent at `epoch`: the warm-up stages, never below `final_density`, then it."""
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return final_density
    stage = int(max(0.0, epoch) * len(WARMUP_DENSITIES) / warmup_epochs)
    return max(WARMUP_DENSITIES[min(stage, len(WARMUP_DENSITIES) - 1)], final_density)


def indices_at_least(tensor: torch.Tensor, threshold: float, block: int | None = None,
                     scratch: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Ascending int64 indices i with |tensor_i| >= threshold > 0 (tensor: flat).

    With `block`, a max/min per block of `block` elements first skips the blocks holding no such entry, so only
    ~density·block of the tensor is looked at element-wise, and no full-size temporary is made. Without it, |tensor|
    and the mask go into `scratch` buffers (reused across calls).
    """
    n = tensor.numel()
    if block is not None and n >= block:
        whole = n // block * block
        rows = tensor[:whole].view(-1, block)
        hit = rows.amax(1) >= threshold
        hit |= rows.amin(1) <= -threshold
        blocks = hit.nonzero().view(-1)
        candidates = rows.index_select(0, blocks).abs_()
        where = (candidates >= threshold).nonzero()
        found = blocks[where[:, 0]] * block + where[:, 1]
        if whole == n:
            return found
        tail = (tensor[whole:].abs() >= threshold).nonzero().view(-1) + whole
        return torch.cat([found, tail])
    scratch = {} if scratch is None else scratch
    magnitude, mask = scratch.get("magnitude"), scratch.get("mask")
    if magnitude is None or magnitude.numel() < n or magnitude.device != tensor.device:
        magnitude = scratch["magnitude"] = torch.empty(n, dtype=tensor.dtype, device=tensor.device)
        mask = scratch["mask"] = torch.empty(n, dtype=torch.bool, device=tensor.device)
    torch.abs(tensor, out=magnitude[:n])
    torch.ge(magnitude[:n], threshold, out=mask[:n])
    return mask[:n].nonzero().view(-1)


@dataclass
class SparseContext:
    """What stays on this rank: the tensor's numel (for decompressing any rank's payload), and for a sparse tensor
    the int64 indices this rank really sent (the payload's first `len(sent)` entries; the rest is padding)."""

    numel: int
    sent: torch.Tensor | None = None


class DGCCompressor(Compressor):
    """Top-k by a sampled threshold. A sparse payload is exactly k = ceil(density·n) values (fp32, or fp16) and
    k int32 indices, whatever the values: entries that did not make it are padding (index 0, value 0.0).

    Tensors with fewer than `min_compress_numel` elements, or with k >= n (density 1.0), are sent dense fp32;
    their memory then holds plain momentum (see DGCMemory).
    """

    def __init__(self, density: float, warmup_epochs: float = 0.0, sample_fraction: float = 0.01,
                 fp16_values: bool = False, min_compress_numel: int = 0, seed: int = 0):
        self.final_density = density
        self.warmup_epochs = warmup_epochs
        self.sample_fraction = sample_fraction
        self.value_dtype = torch.float16 if fp16_values else torch.float32
        self.min_compress_numel = min_compress_numel
        self.seed = seed
        self.epoch = 0.0
        self.kept = 0  # entries really sent this step (sparse tensors), for the train record
        self.slots = 0  # payload entries this step (sparse tensors): kept + padding
        self._generator: torch.Generator | None = None
        self._scratch: dict[str, torch.Tensor] = {}
        self.worst_case = False  # select's larger branch whatever the values: for the plan's profile of the hook

    @property
    def density(self) -> float:
        return density_at(self.epoch, self.warmup_epochs, self.final_density)

    def num_selected(self, numel: int) -> int | None:
        """k for a tensor of `numel` elements at the current epoch, or None when it is sent dense."""
        if numel < self.min_compress_numel:
            return None
        k = math.ceil(self.density * numel)
        return None if k >= numel else k

    def select(self, tensor: torch.Tensor, k: int) -> torch.Tensor:
        """int64 indices of at most k entries of the flat `tensor`, the largest |tensor| (ties aside).

        The threshold is the smallest of the top ceil(density·s) of s = max(1, sample_fraction·n) entries drawn at
        random (with replacement). Every entry at least that large is a candidate; if more than k are, the k
        largest of them are kept (exact top-k over ~k candidates is cheap; at the warm-up's densities, counted
        first and taken over the whole tensor: _at_least_or_top). If fewer are, all of them are kept.
        """
        n = tensor.numel()
        samples = min(n, max(1, int(self.sample_fraction * n)))
        if samples == n:
            sample = tensor.abs()
        else:
            if self._generator is None or self._generator.device != tensor.device:
                self._generator = torch.Generator(device=tensor.device).manual_seed(self.seed)
            drawn = torch.randint(n, (samples,), generator=self._generator, device=tensor.device)
            sample = tensor.index_select(0, drawn).abs_()
        top = min(samples, math.ceil(self.density * samples))
        threshold = float(sample.topk(top, sorted=False).values.min())
        threshold = max(threshold, torch.finfo(tensor.dtype).tiny)  # zeros are never worth sending
        if self.density > BLOCK_MAX_DENSITY:
            return self._at_least_or_top(tensor, threshold, k)
        indices = indices_at_least(tensor, threshold, BLOCK, self._scratch)
        if indices.numel() > k:
            indices = indices[tensor.index_select(0, indices).abs_().topk(k, sorted=False).indices]
        return indices

    def _at_least_or_top(self, tensor: torch.Tensor, threshold: float, k: int) -> torch.Tensor:
        """Above BLOCK_MAX_DENSITY (the warm-up's densities): the entries at least `threshold` when at most k are,
        else the exact k largest |v| (the paper's re-selection when too many pass; the same k entries as the k
        largest candidates, ties aside). Counted first, so that what it allocates never depends on how many
        passed: at most k int64 indices and k fp32 magnitudes (topk's), beside the scratch |v| and mask. The plan
        profiles the hook on the top-k branch, the larger (`worst_case`, set on the profile's compressor)."""
        n = tensor.numel()
        magnitude, mask = self._scratch.get("magnitude"), self._scratch.get("mask")
        if magnitude is None or magnitude.numel() < n or magnitude.device != tensor.device:
            magnitude = self._scratch["magnitude"] = torch.empty(n, dtype=tensor.dtype, device=tensor.device)
            mask = self._scratch["mask"] = torch.empty(n, dtype=torch.bool, device=tensor.device)
        torch.abs(tensor, out=magnitude[:n])
        torch.ge(magnitude[:n], threshold, out=mask[:n])
        passed = int(mask[:n].sum())
        if passed > k or self.worst_case:
            return magnitude[:n].topk(k, sorted=False).indices
        return mask[:n].nonzero().view(-1)

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        tensor = tensor.detach().view(-1)
        k = self.num_selected(tensor.numel())
        if k is None:
            return Compressed([tensor.clone()], SparseContext(tensor.numel()))
        sent = self.select(tensor, k)
        values = torch.zeros(k, dtype=self.value_dtype, device=tensor.device)
        indices = torch.zeros(k, dtype=torch.int32, device=tensor.device)
        chosen = tensor.index_select(0, sent)
        if self.value_dtype == torch.float16:
            chosen.clamp_(-65504.0, 65504.0)
        values[:sent.numel()] = chosen
        indices[:sent.numel()] = sent
        self.kept += sent.numel()
        self.slots += k
        return Compressed([values, indices], SparseContext(tensor.numel(), sent))

    def decompress(self, payload: list[torch.Tensor], ctx: SparseContext) -> torch.Tensor:
        if len(payload) == 1:
            return payload[0]
        values, indices = payload
        out = torch.zeros(ctx.numel, dtype=torch.float32, device=values.device)
        return out.index_add_(0, indices, values.float())  # adds: padding (0, 0.0) changes nothing

    def decompress_add_(self, out: torch.Tensor, payload: list[torch.Tensor], ctx: SparseContext) -> torch.Tensor:
        """Scatter-add straight into `out` (the bucket slice): no n-sized temporary per rank."""
        if len(payload) == 1:
            return out.add_(payload[0].view_as(out))
        values, indices = payload
        return out.view(-1).index_add_(0, indices, values.float()).view_as(out)

    def scratch_bytes(self) -> int:
        """The |v| and mask buffers of _at_least_or_top and indices_at_least (above BLOCK_MAX_DENSITY: the warm-up's
        densities; and tensors under BLOCK elements)."""
        return sum(t.numel() * t.element_size() for t in self._scratch.values())

    def pop_stats(self) -> dict[str, float]:
        """This step's density and the share of the sparse payload slots that carried a value; resets."""
        out = {"density": self.density, "kept_fraction": self.kept / self.slots if self.slots else float("nan")}
        self.kept = self.slots = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch,
                "generator": None if self._generator is None else self._generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self._generator = None
        if state.get("generator") is not None:  # the sampling stream continues where it was (CPU generator)
            self._generator = torch.Generator().manual_seed(self.seed)
            self._generator.set_state(state["generator"])


class DGCMemory(Memory):
    """Momentum correction: u <- m·u + g; v <- v + u; v is what gets sparsified. After sending, v loses exactly
    what was sent (zero there with fp32 values) and, with momentum factor masking, u is zeroed there too.

    g is first clipped (by the L2 norm of its whole bucket, to `clip_norm`, when set: prepare computes the factor)
    and then gains weight_decay·w. Tensors the compressor sends dense skip accumulation: they send u itself
    (g + m·u with Nesterov), i.e. momentum SGD.
    """

    def __init__(self, compressor: DGCCompressor, momentum: float, weight_decay: float = 0.0,
                 nesterov: bool = False, clip_norm: float | None = None, momentum_masking: bool = True):
        self.compressor = compressor
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.clip_norm = clip_norm
        self.momentum_masking = momentum_masking
        self.momentums: dict[str, torch.Tensor] = {}
        self.velocities: dict[str, torch.Tensor] = {}
        self.clip_scales: dict[str, float] = {}  # this bucket's clipping factor, per tensor name (prepare)

    def prepare(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Local gradient clipping: the factor min(1, clip_norm / |g|) of the bucket's whole gradient g."""
        if self.clip_norm is None or not tensors:
            return
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for _, g in tensors])))
        scale = self.clip_norm / norm if norm > self.clip_norm else 1.0
        self.clip_scales = {name: scale for name, _ in tensors}

    def compensate(self, tensor: torch.Tensor, name: str, param: torch.Tensor) -> torch.Tensor:
        gradient = tensor.detach().view(-1)
        if self.clip_norm is not None:
            if name not in self.clip_scales:
                raise RuntimeError(f"DGCMemory.compensate({name!r}) with clipping: call prepare on its bucket first")
            scale = self.clip_scales.pop(name)
            gradient = gradient * scale if scale < 1.0 else gradient
        if self.weight_decay:
            gradient = gradient.add(param.detach().view(-1), alpha=self.weight_decay)
        momentum = self.momentums.get(name)
        if momentum is None:
            momentum = self.momentums[name] = gradient.clone()  # m·0 + g, as torch's SGD starts its buffer
        else:
            torch.add(gradient, momentum, alpha=self.momentum, out=momentum)
        step = gradient.add(momentum, alpha=self.momentum) if self.nesterov else momentum
        if self.compressor.num_selected(gradient.numel()) is None:  # dense: plain momentum SGD
            left = self.velocities.pop(name, None)  # only if this tensor was sparse before: send what was left
            return step if left is None else step + left
        velocity = self.velocities.get(name)
        if velocity is None:
            velocity = self.velocities[name] = step.clone()
        else:
            velocity.add_(step)
        return velocity

    def update(self, tensor: torch.Tensor, name: str, compressor: Compressor, compressed: Compressed) -> None:
        sent = compressed.ctx.sent
        if sent is None:
            return
        values = compressed.payload[0][:sent.numel()].float()
        self.velocities[name].index_add_(0, sent, values, alpha=-1.0)  # v_i - v_i = 0 exactly with fp32 values
        if self.momentum_masking:
            self.momentums[name].index_fill_(0, sent, 0.0)

    def planned_bytes(self, params: list[tuple[str, torch.Tensor]]) -> int:
        """An fp32 momentum per parameter, and a velocity per parameter the compressor sparsifies."""
        return sum(4 * p.numel() * (2 if self.compressor.num_selected(p.numel()) is not None else 1) for _, p in params)

    def state_dict(self) -> dict[str, Any]:
        return {"momentums": dict(self.momentums), "velocities": dict(self.velocities)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentums = dict(state["momentums"])
        self.velocities = dict(state["velocities"])


class DGCParams(CompressionParams):
    """DGC's hyperparameters; `momentum`, `nesterov` and `weight_decay` are applied in the memory, not the optimizer."""

    density: float = Field(default=0.001, gt=0, le=1, description="final fraction of each tensor sent (0.001: 99.9%)")
    warmup_epochs: float = Field(default=4, ge=0, description="epochs of exponential sparsity warm-up (0: none)")
    sample_fraction: float = Field(default=0.01, gt=0, le=1, description="share of |v| sampled for the threshold")
    clip_norm: float | None = Field(default=None, gt=0, description="the former name of grad_clip in dgc: local "
                                    "gradient clipping at c / sqrt(N) by the bucket's norm (None: off)")
    fp16_values: bool = False
    momentum_masking: bool = True
    min_compress_numel: int = Field(default=1000, ge=0,
                                    description="smaller tensors are sent dense fp32 through plain momentum")

    @model_validator(mode="after")
    def _momentum_sgd_only(self) -> DGCParams:
        if self.optimizer != "sgd":
            raise ValueError(f"optimizer = {self.optimizer!r}: dgc's momentum correction is momentum SGD's, applied "
                             "before sparsification; use optimizer = 'sgd'")
        if self.grad_clip is not None and self.clip_norm is not None:
            raise ValueError("grad_clip and clip_norm are both dgc's local gradient clipping: give one")
        return self

    @property
    def local_clip(self) -> float | None:
        """The norm c of the paper's local clipping (grad_clip, or its older name clip_norm)."""
        return self.grad_clip if self.grad_clip is not None else self.clip_norm


class DGC(CompressedDDP):
    """Deep Gradient Compression (Lin et al., ICLR 2018). On rank k of N, each step, for each parameter tensor
of n elements (as its DDP bucket's gradient is ready):

        g <- grad f(w; B_k)                       this rank's shard of the global batch
        g <- g · min(1, c / (sqrt(N) |g|))        local gradient clipping, when grad_clip = c (|g|: the bucket's)
        g <- g + weight_decay · w
        u <- m · u + g                            momentum correction: the momentum is local ...
        v <- v + u                                ... and accumulated
        d <- density(epoch)                       warm-up: 25%, 6.25%, 1.5625%, 0.4%, 0.1%, then `density`
        thr <- min of the top ceil(d·s) of s = sample_fraction·n entries of |v| drawn at random
        S <- the k = ceil(d·n) largest |v_i| >= thr (fewer if fewer pass)
        send (v_S, S) as k (value, int32 index) pairs, padded with (0.0, 0)
        v_S <- 0; u_S <- 0                        momentum factor masking (u only when momentum_masking)
        w <- w - lr · (1/N) sum_ranks scatter(v_S, S)   plain SGD: momentum and decay are already in the update

    Tensors under min_compress_numel elements, and every tensor at density 1.0, send u dense instead (no v, no
    masking): density 1.0 is momentum SGD exactly, as in the reference implementation. With `nesterov`, g + m·u
    takes u's place in what is accumulated or sent.

    Readings. Clipping is by the norm of each DDP bucket's gradient: the rank's whole gradient (the paper's sum of
    squares) when the model fits one bucket (1 MiB first, as torch's DDP makes it; the GPT of suites/lm.toml does),
    so that c / sqrt(N) locally matches a baseline that clips the averaged gradient's global norm at c, as the
    paper intends (the reference implementation clips per tensor; so did this one until issue 37).
    Weight decay joins g after clipping
    and before the momentum, so it is sparsified with g (the reference's optimizer instead keeps a separate dense
    momentum for the decay term). Padding entries are counted in the payload bytes: they are on the wire.
    Train records gain `density` and `kept_fraction` (sparse payload slots that carried a value).
    """

    name = "dgc"
    family = "data-parallel-compressed"
    summary = "Deep Gradient Compression: momentum-corrected top-0.1% sparsification with warm-up (Lin et al. 2018)"
    Params = DGCParams
    clips_update = False  # grad_clip is the local clipping above, before the momentum; the update is not clipped

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        # momentum and weight decay are applied in DGCMemory, before sparsification
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=ctx.params.lr, momentum=0.0, weight_decay=0.0)

    def make_compressor(self) -> DGCCompressor:
        p = self.ctx.params
        return DGCCompressor(p.density, p.warmup_epochs, p.sample_fraction, p.fp16_values, p.min_compress_numel,
                             seed=self.ctx.seed * 65_537 + self.ctx.rank)

    def make_memory(self, compressor: DGCCompressor) -> DGCMemory:
        p = self.ctx.params
        clip = None if p.local_clip is None else p.local_clip / math.sqrt(self.ctx.world_size)
        return DGCMemory(compressor, p.momentum, p.weight_decay, p.nesterov and p.momentum > 0, clip,
                         p.momentum_masking)

    def dense_names(self) -> set[str]:
        return set()  # small tensors go dense inside DGCCompressor, still through the memory's momentum

    def make_profile_hook(self, comm: Communicator) -> CompressionHook:
        """The profiled hook selects by its larger branch (DGCCompressor.worst_case): at the warm-up's densities the
        exact top-k, whose bytes bound those of any count of candidates at least the sampled threshold."""
        hook = self.make_hook(comm)
        hook.compressor.worst_case = True
        return hook

    def train_step(self, batch: Batch) -> StepStats:
        self.compressor.epoch = batch.epoch
        stats = super().train_step(batch)
        stats.extra.update(self.compressor.pop_stats())
        return stats
