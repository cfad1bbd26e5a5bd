"""The compression core: bit packing, the wire buffer, error feedback, and the hook on real processes."""

from __future__ import annotations

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.bits import pack_bits, pack_bits_, unpack_bits
from methods.compression.core import Compressed, Compressor, ErrorFeedback
from methods.compression.packing import from_wire, to_wire


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 8, 1001])
def test_pack_unpack_round_trip(bits, n):
    codes = torch.randint(0, 1 << bits, (n,), dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.numel() == -(-n * bits // 8)
    assert torch.equal(unpack_bits(packed, bits, n), codes)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_in_place_packing_equals_the_definition(bits):
    codes = torch.randint(0, 1 << bits, (4096,), dtype=torch.uint8)
    per = 8 // bits
    expected = sum(codes.view(-1, per)[:, i].int() << (i * bits) for i in range(per)).to(torch.uint8)
    before = codes.clone()
    assert torch.equal(pack_bits(codes, bits), expected)
    assert torch.equal(codes, before)  # pack_bits leaves its input alone ...
    assert torch.equal(pack_bits_(codes, bits), expected)  # ... pack_bits_ packs in place


def test_pack_rejects_other_widths():
    with pytest.raises(ValueError, match="bits must be"):
        pack_bits(torch.zeros(4, dtype=torch.uint8), 3)


def test_wire_round_trip_keeps_dtypes_and_shapes():
    items = [Compressed([torch.arange(5, dtype=torch.uint8), torch.tensor([1.5, -2.0])]),
             Compressed([torch.tensor([3], dtype=torch.int32), torch.randn(2, 3).half()])]
    wire, layout = to_wire(items)
    assert wire.dtype == torch.uint8 and wire.numel() == sum(i.nbytes for i in items) == 5 + 8 + 4 + 12
    back = from_wire(wire.clone(), layout)
    for item, payload in zip(items, back, strict=True):
        for a, b in zip(item.payload, payload, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


class _Sign(Compressor):
    """A biased compressor (sign times mean magnitude), to exercise error feedback."""

    def compress(self, tensor, name):
        return Compressed([torch.sign(tensor), tensor.abs().mean().view(1)])

    def decompress(self, payload, ctx):
        return payload[0] * payload[1]


def test_error_feedback_sent_plus_residual_equals_accumulated_gradient():
    memory, codec = ErrorFeedback(), _Sign()
    grads = [torch.randn(50) for _ in range(6)]
    sent_total = torch.zeros(50)
    for g in grads:
        compensated = memory.compensate(g, "w", g)
        compressed = codec.compress(compensated, "w")
        memory.update(compensated, "w", codec, compressed)
        sent = codec.decompress(compressed.payload, compressed.ctx)
        torch.testing.assert_close(sent + memory.residuals["w"], compensated)
        sent_total += sent
    torch.testing.assert_close(sent_total + memory.residuals["w"], torch.stack(grads).sum(0), rtol=1e-5, atol=1e-5)


def _steps(rank, world_size, method, params, steps):
    cls, ctx = context(method, rank, world_size, params)
    m = cls(ctx)
    order = DataOrder(len(ctx.workload.train), params.get("batch_size", 32), seed=0)
    history, extras = [], []
    for step in range(steps):
        stats = m.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        history.append(torch.cat([p.detach().flatten() for p in m.model.module.parameters()]))
        extras.append(stats.extra)
    return history, extras, ctx.comm.ledger.by_category()


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [("qsgd", {"bits": 4}), ("qsgd", {"bits": 2, "norm": "max"}),
                                           ("fp16", {})])
def test_ranks_hold_identical_parameters_after_every_step(method, params):
    (h0, extras, by_cat), (h1, _, _) = spawn(_steps, 2, method, params, 4)
    for step, (a, b) in enumerate(zip(h0, h1, strict=True)):
        assert torch.equal(a, b), f"{method}: ranks differ after step {step + 1}"
    # The bytes in the ledger are the bytes the hook handed over (2 ranks: all-gather and all-reduce both move n).
    assert by_cat["gradients"][0] == sum(e["payload_bytes"] for e in extras)
    assert all(e["compression_ratio"] > 1.9 for e in extras)


class _Half(Compressor):
    """A compressor whose payload sums: fp16, to exercise the hook's all-reduce strategy."""

    sums = True

    def compress(self, tensor, name):
        return Compressed([tensor.half()])

    def decompress(self, payload, ctx):
        return payload[0].float()


def _half_steps(rank, world_size, steps):
    from methods.compression.compressed_ddp import CompressedDDP

    class HalfDDP(CompressedDDP):
        name = "half"

        def make_compressor(self):
            return _Half()

    _, ctx = context("qsgd", rank, world_size, {})
    method = HalfDDP(ctx)
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    history, extras = [], []
    for step in range(steps):
        stats = method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        history.append(torch.cat([p.detach().flatten() for p in method.model.module.parameters()]))
        extras.append(stats.extra)
    grads = torch.cat([p.grad.flatten() for p in method.model.module.parameters()])
    return history, extras, ctx.comm.ledger.by_category(), grads


@pytest.mark.slow
def test_summing_payloads_are_all_reduced_in_their_own_dtype():
    (h0, extras, by_cat, g0), (h1, _, _, g1) = spawn(_half_steps, 2, 3)
    assert all(torch.equal(a, b) for a, b in zip(h0, h1, strict=True))
    assert torch.equal(g0, g1)
    n = g0.numel()
    assert all(e["payload_bytes"] == 2 * n and e["compression_ratio"] == 2.0 for e in extras)
    assert by_cat["gradients"] == [3 * 2 * n, 3 * 2 * n]  # W = 2: an all-reduce moves n bytes each way


def test_a_summing_compressor_refuses_dense_tensors():
    from harness.comm.communicator import Communicator
    from methods.compression.core import Memory
    from methods.compression.hook import CompressionHook

    with pytest.raises(ValueError, match="cannot be mixed with dense fp32"):
        CompressionHook(Communicator(0, 1), _Half(), Memory(), {}, {"bias"})
