"""The GPT workload: transparency of the flushed pipelines and ddp with AdamW and grad_clip, per-token evaluation,
the methods that refuse AdamW, Local Parallelism's language heads and APapo's layer graph of a Transformer."""

from __future__ import annotations

import math

import pytest
import torch

from _dist import context, spawn, train_steps
from harness.evaluation import evaluate_classifier
from harness.optim import clip_gradients

TEXT = ("Shall I compare thee to a summer's day? Thou art more lovely and more temperate: rough winds do shake the "
        "darling buds of May, and summer's lease hath all too short a date. ")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small corpus folder (two text files), with the cache in a temporary folder."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "a.txt").write_text(TEXT * 20)
    (root / "b.txt").write_text(TEXT.upper() * 10)
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dtbench-cache"))


def options(corpus, n_layer=2, **more):
    return {"corpus": str(corpus), "n_layer": n_layer, "n_head": 2, "d_model": 16, "context": 8, "eval_windows": 32,
            **more}


ADAMW = {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1, "grad_clip": 0.5, "batch_size": 8,
         "lr_schedule": "constant", "lr_warmup_steps": 0}


def make(name, corpus, params=None, rank=0, world_size=1, n_layer=2):
    cls, ctx = context(name, rank, world_size, {**ADAMW, **(params or {})}, workload="shakespeare-gpt",
                       options=options(corpus, n_layer))
    return cls(ctx)


def train(method, steps, batch_size=8):
    return train_steps(method, steps, batch_size)


def sgd_on_one_thread(corpus, steps=4):
    """sgd trained as each rank trains (one thread), so its float sums run in the ranks' order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sgd = make("sgd", corpus)
        train(sgd, steps)
    finally:
        torch.set_num_threads(threads)
    return sgd


def flat(method):
    if hasattr(method, "stages"):
        return torch.cat([p.detach().flatten() for s in sorted(method.stages)
                          for p in method.stages[s].module.parameters()])
    return torch.cat([p.detach().flatten() for p in method.network.parameters()])


@pytest.mark.parametrize("name,params", [
    ("gpipe", {"stages": 2, "microbatches": 4}), ("gpipe", {"stages": 4, "microbatches": 3}),
    ("1f1b", {"stages": 2, "microbatches": 4}), ("1f1b", {"stages": 4, "microbatches": 2}),
    ("interleaved-1f1b", {"stages": 4, "stages_per_rank": 2, "microbatches": 4})])
def test_flushed_pipelines_on_the_gpt_equal_sgd_with_adamw_and_a_clipped_global_norm(corpus, name, params):
    sgd = make("sgd", corpus)
    sgd_losses = train(sgd, 4)
    pipeline = make(name, corpus, params)
    losses = train(pipeline, 4)
    torch.testing.assert_close(flat(pipeline), flat(sgd), rtol=0, atol=2e-6)
    assert losses == pytest.approx(sgd_losses, rel=1e-5)
    unclipped = make("sgd", corpus, {"grad_clip": None})
    train(unclipped, 4)
    assert not torch.allclose(flat(unclipped), flat(sgd), atol=1e-4)  # the clip was active: the test can fail


def test_per_stage_clipping_of_an_asynchronous_pipeline_differs_from_the_global_one(corpus):
    """pipedream's stages clip their own gradients (there is no global norm to wait for): with one stage that is
    sgd's clip; with two stages each stage's part of the norm is smaller, so less is clipped."""
    sgd = make("sgd", corpus)
    train(sgd, 3)
    one = make("pipedream", corpus, {"stages": 1})
    train(one, 3)
    torch.testing.assert_close(flat(one), flat(sgd), rtol=0, atol=2e-6)


def test_clip_gradients_is_torch_s_clip_grad_norm():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
    b.load_state_dict(a.state_dict())
    a(torch.randn(3, 5)).square().sum().backward()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        q.grad = p.grad.clone()
    norm = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.1)
    ours = clip_gradients(b.parameters(), 0.1)
    assert ours == pytest.approx(float(norm), rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
    assert clip_gradients(b.parameters(), None) is None


def _ddp_rank(rank, world_size, corpus):
    method = make("ddp", corpus, rank=rank, world_size=world_size)
    losses = train(method, 4)
    return flat(method), losses


@pytest.mark.slow
def test_ddp_on_the_gpt_equals_sgd_at_the_same_global_batch(corpus):
    out = spawn(_ddp_rank, 2, corpus)
    sgd = sgd_on_one_thread(corpus)
    for weights, _ in out:
        torch.testing.assert_close(weights, flat(sgd), rtol=0, atol=1e-5)


def _gpipe_rank(rank, world_size, corpus):
    method = make("1f1b", corpus, {"microbatches": 4}, rank=rank, world_size=world_size, n_layer=2)
    train(method, 4)
    sent = method.ctx.comm.ledger.by_category()
    return [p.detach().clone() for p in method.stages[rank].module.parameters()], sent


@pytest.mark.slow
def test_the_multi_process_pipeline_reduces_the_norm_across_its_stages(corpus):
    """On 4 real ranks each stage holds part of the norm: the stages' sums are all-reduced (category grad_norm), and
    the weights equal sgd's."""
    out = spawn(_gpipe_rank, 4, corpus)
    sgd = sgd_on_one_thread(corpus)
    ours = torch.cat([p.flatten() for params, _ in out for p in params])
    torch.testing.assert_close(ours, flat(sgd), rtol=0, atol=2e-6)
    assert all(sent["grad_norm"][0] > 0 for _, sent in out)


def test_evaluation_is_per_token(corpus):
    method = make("sgd", corpus)
    test = method.ctx.workload.test
    result = evaluate_classifier(method.network, test, method.ctx.workload.loss, method.ctx.comm, batch_size=5)
    idx = torch.arange(len(test))
    with torch.no_grad():
        logits = method.network(test.inputs(idx))
    y = test.targets(idx)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert result.loss == pytest.approx(float(expected), rel=1e-6)
    assert result.accuracy == pytest.approx(float((logits.argmax(-1) == y).float().mean()), rel=1e-6)
    pipeline = make("gpipe", corpus, {"stages": 3})
    assert pipeline.evaluate(test).loss == pytest.approx(result.loss, rel=1e-6)


def test_sgd_learns_the_corpus(corpus):
    method = make("sgd", corpus, {"lr": 1e-2}, n_layer=1)
    before = method.evaluate(method.ctx.workload.test).loss
    assert before == pytest.approx(math.log(method.ctx.workload.classes), abs=0.1)  # uniform at the start
    train(method, 60)
    assert method.evaluate(method.ctx.workload.test).loss < before - 1.0


@pytest.mark.parametrize("name,params,field", [
    ("dgc", {}, "optimizer"), ("pb", {"batch_size": 1}, "compensation"),
    ("pb", {"batch_size": 1, "compensation": "none"}, "prediction"),
    ("apapo", {"compensation": "sc"}, "compensation"), ("apapo", {"prediction": "lwp_v"}, "prediction")])
def test_adamw_where_a_method_needs_momentum_sgd_is_one_clear_error(corpus, name, params, field):
    with pytest.raises(ValueError, match=f"optimizer = 'adamw' with {field}" if field != "optimizer" else
                       "optimizer = 'adamw': dgc's momentum correction"):
        make(name, corpus, params)


def test_dgc_s_grad_clip_is_its_local_clipping_and_the_update_is_not_clipped_again():
    from methods.compression.dgc import DGC

    assert DGC.Params(grad_clip=0.5).local_clip == 0.5 and DGC.Params(clip_norm=0.25).local_clip == 0.25
    assert not DGC.clips_update
    with pytest.raises(ValueError, match="grad_clip and clip_norm"):
        DGC.Params(grad_clip=0.5, clip_norm=0.5)


def test_local_gives_each_chunk_a_language_head(corpus):
    method = make("local", corpus, {"chunks": 2})
    head = method.heads[0]
    assert isinstance(head[0], torch.nn.LayerNorm) and head[1].out_features == method.ctx.workload.classes
    losses = train(method, 3)
    assert all(math.isfinite(v) for v in losses)
    result = method.evaluate(method.ctx.workload.test)
    assert len(result.extra["head_loss"]) == 2 and math.isfinite(result.loss)


def test_apapo_traces_the_transformer_into_layers(corpus):
    from methods.pipeline.apapo.layers import layer_count

    method = make("apapo", corpus, {"partition": "uniform", "stages": 2})
    model = method.ctx.workload.make_model()
    # embeddings 1; per block: ln1, attention, add, ln2, 3 MLP layers, dropout, add = 9; head: ln, linear
    assert layer_count(model) == 1 + 2 * 9 + 2
    losses = train(method, 3)
    assert all(v is None or math.isfinite(v) for v in losses)


def test_the_reference_is_also_named_single_and_runs_the_same_steps(corpus):
    from harness import registry

    assert registry.METHODS.get("single") is registry.METHODS.get("sgd")
    sgd, single = make("sgd", corpus), make("single", corpus)
    assert sgd.ctx.params.optimizer == "adamw"
    train(sgd, 3)
    train(single, 3)
    assert torch.equal(flat(sgd), flat(single))
