"""PowerSGD's DDP hook (Vogels et al., NeurIPS 2019, Algorithm 1): torch's powerSGD_hook step for step, with what its
callbacks hold kept where the main thread lets go of it (methods/compression/retire.py)."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _orthogonalize,
    _report_compression_stats,
    _should_compress,
)

from harness.memory.peak import thread
from methods.compression.retire import Retired


def _all_reduce(tensor: torch.Tensor, group) -> torch.futures.Future:
    """An in-place all-reduce's future, as torch's hook issues it (dist.all_reduce, async)."""
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket, retired: Retired) -> torch.futures.Future:
    """torch's powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py, torch 2.14), the same
    arithmetic, collectives and state (torch's PowerSGDState: error feedback per bucket, warm start's P and Q
    memories, start_powerSGD_iter, min_compression_rate, its seeded RNG for Q's first draw), with each compressed
    tensor on its own (batch_tensors_with_same_shape off, torch's default). For bucket M (the flat gradient):

        before start_powerSGD_iter steps: M <- M / W, all-reduced in place (plain DDP);
        after:  M <- M + e (error feedback; e = 0 at first); keep M_cp = M;
                per tensor viewed as an n x m matrix: compressed if (n + m)·r'·rate < n·m (r' = min(n, m, r)),
                else all-reduced whole with the others (their cat, then / W);
                Q <- the last step's Q (warm start) or a fresh N(0, 1) draw, orthogonalized; P <- M Q;
                all-reduce P; orthogonalize P; Q <- Mᵀ P; all-reduce Q; Q <- Q / W; M <- P Qᵀ;
                e <- M_cp - M.

    The difference is where its tensors live: torch's callbacks keep them in their closures, which gloo's worker
    thread drops after the last callback (where the CPU allocator's meter cannot see the frees); here the callbacks
    read them from a bag of `retired`, which the method releases on the main thread after its backward, and the
    uncompressed tensors' cat, handed to gloo, is marked sent. Bucket after bucket, each callback issues the next
    all-reduce and waits for it (as torch's does), on gloo's thread."""
    if state.batch_tensors_with_same_shape:
        raise ValueError("powersgd_hook compresses each tensor on its own (batch_tensors_with_same_shape=False)")
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size = group.size()
    input_tensor = bucket.buffer()

    if state.iter < state.start_powerSGD_iter:  # torch's default_hooks._allreduce_fut
        state.maybe_increase_iter(bucket)
        input_tensor.div_(world_size)
        return _all_reduce(input_tensor, group).then(lambda fut: fut.value()[0])

    device, dtype = input_tensor.device, input_tensor.dtype
    bucket_index = bucket.index()
    input_tensor_cp = None
    if state.use_error_feedback:
        if bucket_index in state.error_dict:
            input_tensor.add_(state.error_dict[bucket_index])
        else:
            state.error_dict[bucket_index] = torch.zeros(input_tensor.shape[0], device=device, dtype=dtype)
        input_tensor_cp = input_tensor.detach().clone()

    tensors = bucket.gradients()
    matrices, uncompressed = [], []
    total_ps = total_qs = 0
    for tensor in tensors:
        matrix = tensor.view(tensor.shape[0], -1)
        n, m = matrix.shape
        rank = min(n, m, state.matrix_approximation_rank)
        worth, before, after = _should_compress(n, m, rank, state.min_compression_rate)
        state.total_numel_before_compression += before
        if worth:
            matrices.append(matrix)
            total_ps += n * rank
            total_qs += m * rank
            state.total_numel_after_compression += after
        else:
            uncompressed.append(tensor)
            state.total_numel_after_compression += before
    _report_compression_stats(bucket, state)

    uncompressed_memory = (torch.cat([t.view(-1) for t in uncompressed]) if uncompressed
                           else torch.tensor([], device=device, dtype=dtype))

    need_randomize_qs = not state.warm_start or bucket_index not in state.p_memory_dict
    if need_randomize_qs:
        state.p_memory_dict[bucket_index] = torch.empty(total_ps, device=device, dtype=dtype)
        state.q_memory_dict[bucket_index] = torch.empty(total_qs, device=device, dtype=dtype)

    by_shape: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
    for matrix in matrices:
        by_shape[matrix.shape].append(matrix)
    compressed, ps, qs = [], [], []
    p_idx = q_idx = 0
    for group_of_shape in by_shape.values():
        for matrix in group_of_shape:
            tensor = matrix.unsqueeze(0)
            batch, n, m = tensor.shape
            rank = min(n, m, state.matrix_approximation_rank)
            compressed.append(tensor)
            ps.append(state.p_memory_dict[bucket_index][p_idx:p_idx + batch * n * rank].view(batch, n, rank))
            qs.append(state.q_memory_dict[bucket_index][q_idx:q_idx + batch * m * rank].view(batch, m, rank))
            p_idx += batch * n * rank
            q_idx += batch * m * rank

    if not need_randomize_qs:
        for q in qs:
            _orthogonalize(q, state.orthogonalization_epsilon)
    else:
        with torch.random.fork_rng(devices=[]):
            # torch's hook: Q is drawn on the CPU, seeded by the state's RNG, the same on every rank
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))
                _orthogonalize(q, state.orthogonalization_epsilon)

    for tensor, q, p in zip(compressed, qs, ps, strict=True):
        torch.bmm(tensor, q, out=p)

    bag = retired.bag(input_tensor_cp=input_tensor_cp, uncompressed=uncompressed, compressed=compressed, ps=ps,
                      qs=qs)
    fut = _all_reduce(uncompressed_memory, group)
    retired.sent(uncompressed_memory)
    del input_tensor_cp, uncompressed, compressed, ps, qs, matrices, tensors, uncompressed_memory, by_shape

    # Each callback runs on gloo's worker thread (or on this one, if its future is already complete): `thread()` has
    # its allocations and frees join the rank's allocator meter; what they make and keep is persistent state.
    def unpack_uncompressed_tensors_and_allreduce_ps(fut):
        with thread():
            memory = fut.value()[0].div_(world_size)
            idx = 0
            for tensor in bag["uncompressed"]:
                tensor.copy_(memory[idx:idx + tensor.numel()].view_as(tensor))
                idx += tensor.numel()
            return _all_reduce(state.p_memory_dict[bucket_index], group).wait()[0]

    def compute_qs(fut):
        with thread():
            state.p_memory_dict[bucket_index] = fut.value()
            for p in bag["ps"]:
                _orthogonalize(p, state.orthogonalization_epsilon)
            for tensor, p, q in zip(bag["compressed"], bag["ps"], bag["qs"], strict=True):
                torch.bmm(tensor.transpose(1, 2), p, out=q)
            return _all_reduce(state.q_memory_dict[bucket_index], group).wait()[0]

    def decompress(fut):
        with thread():
            state.q_memory_dict[bucket_index] = fut.value().div_(world_size)
            for p, q, tensor in zip(bag["ps"], bag["qs"], bag["compressed"], strict=True):
                torch.bmm(p, q.transpose(1, 2), out=tensor)
            if torch.cuda.is_available():
                torch.cuda.synchronize(device)
            if state.use_error_feedback:
                state.error_dict[bucket_index] = bag["input_tensor_cp"] - input_tensor
            if not state.warm_start:
                state.p_memory_dict.clear()
                state.q_memory_dict.clear()
            state.maybe_increase_iter(bucket)
            return input_tensor

    return fut.then(unpack_uncompressed_tensors_and_allreduce_ps).then(compute_qs).then(decompress)
