"""dgc: warm-up schedule, sampled top-k selection, fixed payloads, momentum correction and masking, and on real
processes: density 1.0 is momentum SGD, and ranks stay identical while sparsified."""

from __future__ import annotations

import math

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.compression.dgc import DGCCompressor, DGCMemory, density_at


@pytest.mark.parametrize(("epoch", "expected"), [
    (0.0, 0.25), (0.99, 0.25), (1.0, 0.0625), (1.5, 0.0625), (2.0, 0.015625), (3.0, 0.004), (4.0, 0.001),
    (4.99, 0.001), (5.0, 0.0005), (50.0, 0.0005)])
def test_density_at_steps_through_the_five_warmup_stages_then_the_final_density(epoch, expected):
    assert density_at(epoch, 5, 0.0005) == expected


def test_density_at_never_goes_below_the_final_density_and_warmup_zero_disables():
    assert [density_at(e, 4, 0.01) for e in (0.0, 1.0, 1.7, 2.5, 3.5, 4.0)] == [0.25, 0.0625, 0.015625, 0.01,
                                                                                  0.01, 0.01]
    assert density_at(0.0, 0, 0.001) == 0.001
    assert density_at(0.0, 4, 1.0) == 1.0


# Tolerance of the kept count: the count above the threshold drawn from a sample's top k_s is about
# k·(1 ± 1/sqrt(k_s)); every case has k_s >= 100, so 0.5k is 5 standard deviations away. Above k, the k largest
# candidates are kept, so the count never exceeds k.
@pytest.mark.parametrize(("density", "sample_fraction"), [(0.25, 0.01), (0.01, 0.01), (0.001, 0.1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selection_keeps_close_to_k_entries_and_they_are_the_largest(density, sample_fraction, seed):
    n = 1_000_003  # not a multiple of the pre-filter block: the tail is exercised
    torch.manual_seed(seed)
    v = torch.randn(n) * torch.rand(n)  # a varied scale, not just a Gaussian
    v[-1] = -2 * v.abs().max()  # the largest entry sits in the tail after the last whole block
    codec = DGCCompressor(density, sample_fraction=sample_fraction, seed=seed)
    k = math.ceil(density * n)
    compressed = codec.compress(v, "w")
    sent = compressed.ctx.sent
    kept = sent.numel()
    assert 0.5 * k <= kept <= k
    assert set(sent.tolist()) == set(v.abs().topk(kept).indices.tolist())  # exactly the `kept` largest |v|
    values, indices = compressed.payload
    assert torch.equal(values[:kept], v[sent]) and torch.equal(indices[:kept].long(), sent)
    assert not values[kept:].any() and not indices[kept:].any()  # padding: (index 0, value 0.0)


@pytest.mark.parametrize("fp16", [False, True])
def test_payload_has_k_values_and_k_int32_indices_whatever_the_values(fp16):
    n, density = 50_000, 0.01
    k = math.ceil(density * n)
    spikes = torch.zeros(n)
    spikes[[0, 17, 40_000]] = torch.tensor([2.0, -3.0, 0.5])
    tensors = {"gaussian": torch.randn(n), "zeros": torch.zeros(n), "constant": torch.full((n,), 3.0),
               "spikes": spikes, "heavy tailed": torch.randn(n) ** 5}
    codec = DGCCompressor(density, fp16_values=fp16)
    for label, v in tensors.items():
        compressed = codec.compress(v, label)
        values, indices = compressed.payload
        assert values.shape == indices.shape == (k,), label
        assert values.dtype == (torch.float16 if fp16 else torch.float32) and indices.dtype == torch.int32, label
        assert compressed.nbytes == k * (2 if fp16 else 4) + 4 * k, label
    # Only three entries pass: the rest is padding at index 0, which adds nothing even where index 0 was sent.
    compressed = codec.compress(spikes, "spikes")
    assert compressed.ctx.sent.numel() == 3
    assert torch.equal(codec.decompress(compressed.payload, compressed.ctx), spikes)


def test_small_tensors_and_density_one_are_sent_dense():
    assert len(DGCCompressor(0.001, min_compress_numel=1000).compress(torch.randn(999), "b").payload) == 1
    assert len(DGCCompressor(0.001, min_compress_numel=1000).compress(torch.randn(1000), "w").payload) == 2
    dense = DGCCompressor(1.0).compress(torch.randn(5000), "w")
    assert [(p.dtype, p.numel()) for p in dense.payload] == [(torch.float32, 5000)]


def _step(memory: DGCMemory, codec: DGCCompressor, gradient: torch.Tensor, param: torch.Tensor | None = None):
    velocity = memory.compensate(gradient, "w", gradient if param is None else param)
    before = velocity.clone(), memory.momentums["w"].clone()
    compressed = codec.compress(velocity, "w")
    memory.update(velocity, "w", codec, compressed)
    return before, compressed


@pytest.mark.parametrize("masking", [True, False])
def test_momentum_masking_zeroes_u_and_v_exactly_where_sent_and_keeps_the_rest(masking):
    torch.manual_seed(0)
    n = 20_000
    codec = DGCCompressor(0.01)
    memory = DGCMemory(codec, momentum=0.9, momentum_masking=masking)
    u_prev, v_prev = torch.zeros(n), torch.zeros(n)
    for _ in range(4):
        g = torch.randn(n)
        (v_before, u_before), compressed = _step(memory, codec, g)
        torch.testing.assert_close(u_before, 0.9 * u_prev + g)  # momentum correction: u <- m·u + g
        torch.testing.assert_close(v_before, v_prev + u_before)  # v <- v + u
        sent = torch.zeros(n, dtype=torch.bool)
        sent[compressed.ctx.sent] = True
        assert sent.sum() > 0.5 * math.ceil(0.01 * n)
        u, v = memory.momentums["w"], memory.velocities["w"]
        assert torch.equal(v[sent], torch.zeros(int(sent.sum())))
        assert torch.equal(v[~sent], v_before[~sent])
        if masking:
            assert torch.equal(u[sent], torch.zeros(int(sent.sum()))) and torch.equal(u[~sent], u_before[~sent])
        else:
            assert torch.equal(u, u_before)
        u_prev, v_prev = u.clone(), v.clone()


@pytest.mark.parametrize("fp16", [False, True])
def test_what_is_not_sent_stays_in_the_velocity(fp16):
    torch.manual_seed(0)
    n = 30_000
    codec = DGCCompressor(0.001, fp16_values=fp16)
    memory = DGCMemory(codec, momentum=0.9, momentum_masking=False)
    sent_total, momentum_total = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for _ in range(5):
        (v_before, u_before), compressed = _step(memory, codec, torch.randn(n))
        sent = codec.decompress(compressed.payload, compressed.ctx)
        assert torch.equal(memory.velocities["w"] + sent, v_before)  # exact: v_after + sent == v + u
        sent_total += sent.double()
        momentum_total += u_before.double()
    # over the steps, everything the momentum produced was either sent or is still in v
    torch.testing.assert_close(sent_total + memory.velocities["w"].double(), momentum_total, rtol=0, atol=1e-4)


def test_clipping_and_weight_decay_act_on_the_gradient_before_the_momentum():
    n = 2_000
    g, w = torch.full((n,), 1.0), torch.full((n,), 2.0)  # |g| = sqrt(2000) ~ 44.7
    memory = DGCMemory(DGCCompressor(1.0), momentum=0.9, weight_decay=0.1, clip_norm=0.5)
    memory.prepare([("w", g)])
    sent = memory.compensate(g, "w", w)
    torch.testing.assert_close(sent, g * 0.5 / math.sqrt(n) + 0.1 * w)  # clipped g, then + wd·w; u = that (step 1)



def test_local_clipping_scales_the_whole_bucket_by_its_joint_norm():
    """The paper clips a node's whole gradient (its sum of squares), not each tensor: two tensors of norms 3 and 4
    clipped at 1 are both scaled by 1/5, so their directions relative to each other are kept."""
    a, b = torch.full((9,), 1.0), torch.full((16,), 1.0)  # norms 3 and 4: the bucket's 5
    memory = DGCMemory(DGCCompressor(1.0), momentum=0.0, clip_norm=1.0)
    memory.prepare([("a", a), ("b", b)])
    torch.testing.assert_close(memory.compensate(a, "a", a), a / 5)
    torch.testing.assert_close(memory.compensate(b, "b", b), b / 5)
    with pytest.raises(RuntimeError, match="call prepare on its bucket first"):
        memory.compensate(a, "a", a)  # each factor serves one compensate: a new bucket needs prepare again
    memory.prepare([("a", a / 10)])  # under the threshold: untouched
    torch.testing.assert_close(memory.compensate(a / 10, "a", a), a / 10)


def _train(rank: int, world_size: int, method_name: str, params: dict, epochs: list[float]):
    """Parameters after every step, the train-record extras, the memory's clip threshold, and parameter sizes."""
    cls, ctx = context(method_name, rank, world_size, params)
    method = cls(ctx)
    order = DataOrder(len(ctx.workload.train), params["batch_size"], seed=0)
    history, extras = [], []
    model = method.model.module if hasattr(method.model, "module") else method.model
    for step, epoch in enumerate(epochs):
        extras.append(method.train_step(Batch(step, epoch, order.batch(step), ctx.workload.train, 0)).extra)
        history.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    clip = getattr(getattr(method, "memory", None), "clip_norm", None)
    return history, extras, clip, [p.numel() for p in model.parameters()]


def _train_each(rank: int, world_size: int, runs: dict[str, tuple[dict, list[float]]]):
    return {label: _train(rank, world_size, "dgc", params, epochs) for label, (params, epochs) in runs.items()}


_BASE = {"batch_size": 32, "lr": 0.05, "momentum": 0.9}
_DENSE_CASES = {"plain": {}, "weight decay": {"weight_decay": 0.01},
                "weight decay, nesterov": {"weight_decay": 0.01, "nesterov": True}}
_SPARSE = {**_BASE, "weight_decay": 1e-4, "density": 0.01, "warmup_epochs": 4, "clip_norm": 1.0}
_SPARSE_EPOCHS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


@pytest.fixture(scope="module")
def two_rank_runs():
    """Every DGC run of this file on one pair of processes (spawning is most of the cost): label -> per rank."""
    runs = {label: ({**_BASE, **extra, "density": 1.0, "warmup_epochs": 0}, [0.0] * 6)
            for label, extra in _DENSE_CASES.items()}
    runs["sparse"] = (_SPARSE, _SPARSE_EPOCHS)
    per_rank = spawn(_train_each, 2, runs)
    return {label: [results[label] for results in per_rank] for label in runs}


@pytest.mark.slow
@pytest.mark.parametrize("label", list(_DENSE_CASES))
def test_density_one_is_exactly_momentum_sgd(two_rank_runs, label):
    sgd_history, _, _, _ = _train(0, 1, "sgd", {**_BASE, **_DENSE_CASES[label]}, [0.0] * 6)
    for history, extras, _, _ in two_rank_runs[label]:
        assert all(e["density"] == 1.0 for e in extras)
        for step, (p_dgc, p_sgd) in enumerate(zip(history, sgd_history, strict=True)):
            torch.testing.assert_close(p_dgc, p_sgd, rtol=1e-5, atol=1e-6, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.mark.slow
def test_ranks_stay_identical_while_sparsified_through_the_warmup(two_rank_runs):
    (history0, extras0, clip, numels), (history1, _, _, _) = two_rank_runs["sparse"]
    assert clip == pytest.approx(1.0 / math.sqrt(2))  # the local clipping threshold is clip_norm · N^(-1/2)
    for step, (p0, p1) in enumerate(zip(history0, history1, strict=True)):
        assert torch.equal(p0, p1), f"ranks differ after step {step + 1}"
    densities = [0.25, 0.0625, 0.015625, 0.01, 0.01, 0.01, 0.01]
    assert [e["density"] for e in extras0] == densities
    for extra, density in zip(extras0, densities, strict=True):  # sparse: k (fp32, int32) pairs; small: dense fp32
        expected = sum(math.ceil(density * n) * 8 if n >= 1000 else n * 4 for n in numels)
        assert extra["payload_bytes"] == expected
        assert 0.5 < extra["kept_fraction"] <= 1.0
    sgd_history, _, _, _ = _train(0, 1, "sgd", _BASE, _SPARSE_EPOCHS)
    assert not torch.allclose(history0[-1], sgd_history[-1], rtol=1e-3, atol=1e-4)  # sparsification did act
