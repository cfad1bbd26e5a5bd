"""PowerSGD (Vogels et al., NeurIPS 2019): torch's powerSGD_hook, step for step (methods/compression/powersgd_hook.py),
with the bytes of every all-reduce it sends counted where it hands them over."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field, model_validator
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

from harness.comm.communicator import ring_all_reduce_bytes
from harness.data.tensors import Batch
from harness.memory import gradient_bytes, state_tensors, tensor_bytes
from harness.method import RunContext, StepStats
from methods.compression.powersgd_hook import powersgd_hook
from methods.compression.powersgd_state import ParameterState, compressed, matrix_shape
from methods.compression.retire import ReleasedAfterBackward, Retired
from methods.compression.stats import bytes_record
from methods.reference.ddp import DDP, DDPParams


class PowerSGDParams(DDPParams):
    """PowerSGD's keys, named as the paper and torch's PowerSGDState name them (and ddp's `microbatches`)."""

    rank: int = Field(default=2, ge=1, description="r: an n x m gradient matrix travels as P (n x r) and Q (m x r), "
                      "all-reduced one after the other (torch's matrix_approximation_rank)")
    start_iter: int = Field(default=10, ge=1, description="steps of plain fp32 all-reduce before compression starts "
                            "(torch's start_powerSGD_iter; at least 2 with error feedback or warm start)")
    use_error_feedback: bool = Field(default=True, description="carry what compression left out into the next "
                                     "step's gradient (the paper's error feedback)")
    warm_start: bool = Field(default=True, description="start each step's power iteration from the last step's Q")
    min_compression_rate: float = Field(default=2.0, gt=0, description="a matrix is compressed only when n·m / "
                                        "((n + m)·r) exceeds this; others (biases, small matrices) go as fp32")

    @model_validator(mode="after")
    def _warm_up_long_enough(self) -> PowerSGDParams:
        if (self.use_error_feedback or self.warm_start) and self.start_iter < 2:
            raise ValueError("start_iter must be at least 2 with use_error_feedback or warm_start (torch's "
                             "PowerSGDState requires it: DDP rebuilds its buckets after the first step)")
        return self


def powersgd_payload_numel(shapes: list[tuple[int, ...]], rank: int, min_compression_rate: float) -> int:
    """Elements one rank all-reduces in a compressed step for gradients of these shapes: (n + m)·r' per matrix
    compressed (the tensor viewed as n = shape[0] rows, r' = min(n, m, rank)), n·m for each one left uncompressed
    (n·m / ((n + m)·r') not above min_compression_rate), the rule of torch's _should_compress."""
    total = 0
    for shape in shapes:
        n, m = matrix_shape(shape)
        total += (n + m) * min(n, m, rank) if compressed(shape, rank, min_compression_rate) else n * m
    return total


class PowerSGD(ReleasedAfterBackward, DDP):
    """Per bucket, after `start_iter` steps of plain all-reduce: for each gradient matrix M (with the error e of the
    last step added: M <- M + e), P = M Q (Q from the last step, or random), all-reduce P, orthogonalize it,
    Q = Mᵀ P, all-reduce Q and divide by W, M' = P Qᵀ; e <- M - M'. Tensors not worth compressing are all-reduced
    as fp32 with them. The hook is torch's, written out (powersgd_hook.py) so that what its callbacks hold is let go
    of on the main thread after the backward (methods/compression/retire.py); dtbench counts each step's bytes from
    the shapes it compressed (three
    all-reduces: uncompressed tensors, P, Q) and during warm-up the whole bucket's fp32 all-reduce."""

    name = "powersgd"
    family = "data-parallel-compressed"
    summary = "PowerSGD rank-r gradient compression (torch's powerSGD_hook), with error feedback and warm start"
    Params = PowerSGDParams

    def __init__(self, ctx: RunContext):
        self._payload_bytes = 0  # per step, reset by train_step
        self._dense_bytes = 0
        self._previous: torch.futures.Future | None = None  # the last bucket's hook future
        self.retired = Retired()  # what the hook's callbacks hold, released after each backward
        super().__init__(ctx)

    def register_hook(self) -> None:
        p = self.ctx.params
        self.state = PowerSGDState(process_group=self.ctx.comm.group, matrix_approximation_rank=p.rank,
                                   start_powerSGD_iter=p.start_iter, min_compression_rate=p.min_compression_rate,
                                   use_error_feedback=p.use_error_feedback, warm_start=p.warm_start,
                                   random_seed=self.ctx.seed)
        self.names = {param: name for name, param in self.network.named_parameters()}
        self.per_parameter = ParameterState(p.rank, p.min_compression_rate)
        self.model.register_comm_hook(self.state, self._counted_hook)

    def _counted_hook(self, state, bucket):  # no annotations: DDP checks them literally
        # The hook issues a bucket's P and Q all-reduces from its futures' callbacks, as torch's does; with several
        # buckets in flight two gloo ranks can issue them in different orders (measured: a size-mismatch abort, or a
        # hang with torch's hook alone, on a 1.3M-parameter MLP's two buckets), so a bucket starts once the last one
        # is done.
        if self._previous is not None:
            self._previous.wait()
        params = bucket.parameters()
        self.per_parameter.see(state, bucket.index(), [self.names[q] for q in params], [tuple(q.shape) for q in params])
        buffer = bucket.buffer()
        if state.iter < state.start_powerSGD_iter:
            numel = buffer.numel()
        else:
            p = self.ctx.params
            numel = powersgd_payload_numel([tuple(g.shape) for g in bucket.gradients()], p.rank,
                                           p.min_compression_rate)
        wire = ring_all_reduce_bytes(4 * numel, self.ctx.world_size)
        self.ctx.comm.count("gradients", wire, wire)
        self._payload_bytes += 4 * numel
        self._dense_bytes += 4 * buffer.numel()
        self._previous = powersgd_hook(state, bucket, self.retired)
        return self._previous

    def planned_buffer_bytes(self) -> int:
        """DDP's buckets, torch's error per bucket (an fp32 copy of every gradient, with error feedback) and, with
        warm start, each compressed matrix's P and Q (n·r' and m·r' fp32)."""
        p = self.ctx.params
        shapes = [tuple(q.shape) for q in self.network.parameters() if q.requires_grad]
        factors = sum((matrix_shape(s)[0] + matrix_shape(s)[1]) * min(*matrix_shape(s), p.rank)
                      for s in shapes if compressed(s, p.rank, p.min_compression_rate))
        return (super().planned_buffer_bytes() + (gradient_bytes([self.network]) if p.use_error_feedback else 0)
                + (4 * factors if p.warm_start else 0))

    def planned_hook_bytes(self) -> int:
        """torch's powerSGD_hook on a compressed step, on one bucket of n elements (every gradient, as
        CompressedDDP.planned_hook_bytes), u of them in tensors it leaves uncompressed: with error feedback
        `input_tensor_cp` (a 4n copy of the compensated bucket, alive until the backward's end) and, in the last
        callback, the new error `input_tensor_cp - input_tensor` (4n) made while the old one is still held;
        `uncompressed_tensors_memory` (4u, their cat, all-reduced; also kept to the backward's end: retire.py);
        and between them the orthogonalization of P and Q (_orthogonalize_gram_schmidt: `col * rest` and its
        product with `col`, n_i·(r'-1) or m_i·(r'-1) fp32 each, at once for one matrix). The P and Q memories
        are buffers. During warm-up (start_iter) the hook is an in-place all-reduce: nothing."""
        p = self.ctx.params
        shapes = [tuple(q.shape) for q in self.network.parameters() if q.requires_grad]
        n = sum(matrix_shape(s)[0] * matrix_shape(s)[1] for s in shapes)
        uncompressed = sum(matrix_shape(s)[0] * matrix_shape(s)[1] for s in shapes
                           if not compressed(s, p.rank, p.min_compression_rate))
        orthogonalize = max((2 * 4 * max(matrix_shape(s)) * (min(*matrix_shape(s), p.rank) - 1) for s in shapes
                             if compressed(s, p.rank, p.min_compression_rate)), default=0)
        copy, error = (4 * n, 4 * n) if p.use_error_feedback else (0, 0)
        return copy + 4 * uncompressed + max(error, orthogonalize)

    def held_buffer_bytes(self) -> int:
        state = self.state
        return super().held_buffer_bytes() + tensor_bytes(state_tensors(
            [state.error_dict, state.p_memory_dict, state.q_memory_dict]))

    def train_step(self, batch: Batch) -> StepStats:
        stats = super().train_step(batch)
        stats.extra.update(bytes_record(self._dense_bytes, self._payload_bytes), collective="all_reduce")
        self._payload_bytes = self._dense_bytes = 0
        return stats

    # -- checkpoints: per parameter (a resumed DDP lays its buckets out anew), loadable with weights_only ---------
    def state_dict(self) -> dict[str, Any]:
        _, keys, pos, has_gauss, gauss = self.state.rng.get_state()
        return {**super().state_dict(), "powersgd": {
            "iter": self.state.iter, **self.per_parameter.state_dict(self.state),
            "rng_keys": torch.from_numpy(keys.astype(np.int64)), "rng": [int(pos), int(has_gauss), float(gauss)]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = state["powersgd"]
        self.state.iter = int(saved["iter"])
        self.per_parameter.load_state_dict(saved)
        pos, has_gauss, gauss = saved["rng"]
        self.state.rng.set_state(("MT19937", saved["rng_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
