"""Every method's planned bytes against what its ranks measurably held: plan >= held on every rank, in total and kind
by kind, over runs of every registered method and the switches that change what a method keeps (weight versions,
lanes, the virtual mode). Held is the breakdown; how far the plan may sit above what a rank really held is judged
against the allocator's peak (tests/memory/test_allocator_registry.py: plan <= 1.10 x peak), since the plan also
counts what held does not measure by kind (the step's batch and its temporaries)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from harness.registry import BUILTIN_METHODS
from harness.results import read_jsonl

#: APapo's planner on fixed inputs (a counted profile, the ranks' speeds and link given): the same plan every run, so
#: what a stage keeps does not depend on the machine's load.
PINNED = {"profile": "counted", "rank_speeds": [1.0, 1.0], "bandwidth": 1e9}

RUNS = [
    ("sgd", 1, {}, None), ("ddp", 2, {}, None), ("fp16", 2, {}, None), ("qsgd", 2, {"bits": 4}, None),
    ("terngrad", 2, {}, None), ("dgc", 2, {}, None), ("onebit", 2, {}, None),
    ("powersgd", 2, {"rank": 2, "start_iter": 3}, None), ("local", 2, {}, None), ("local", 1, {"chunks": 3}, None),
    ("gpipe", 2, {"microbatches": 4}, None), ("gpipe", 1, {"microbatches": 4, "stages": 3}, None),
    ("1f1b", 2, {"microbatches": 4}, None), ("zb-h1", 3, {"microbatches": 4}, None),
    ("pipedream", 3, {}, None), ("pipedream", 3, {"replicas": [2, 1]}, None),
    ("pipedream", 3, {"vertical_sync": True}, None),
    ("interleaved-1f1b", 2, {"microbatches": 4}, "digits-cnn"),
    ("pb", 3, {"batch_size": 1, "reference_batch": 32}, None),
    ("pb", 3, {"batch_size": 1, "reference_batch": 32, "recompute": False, "prediction": "lwp_w"}, None),
    ("qfb", 2, {"microbatches": 4, "lanes": 1}, None),
    ("qfb", 2, {"microbatches": 4, "sync": "bounded", "lanes": 1}, None),
    ("qfb", 2, {"microbatches": 4, "sync": "ahead", "buffer": 5, "lanes": 1}, None),
    ("qfb", 2, {"microbatches": 4}, None), ("qfb", 2, {"microbatches": 4, "sync": "bounded"}, None),
    ("qfb", 2, {"microbatches": 4, "sync": "ahead", "buffer": 5}, None),
    ("apapo", 2, {"microbatches": 4, "replicate": False, **PINNED}, "digits-resnet"),
    ("apapo", 2, {"microbatches": 4, "delays": "uniform", "iterations_in_flight": 3, "replicate": False, **PINNED},
     None),
]


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _suite() -> str:
    text = ['name = "plans"', 'workload = "digits-mlp"', "seeds = [0]", "threads_per_rank = 1",
            "[budget]", "max_steps = 12", "eval_every_steps = 12",
            "[defaults]", "batch_size = 32", "lr = 0.05", "momentum = 0.9"]
    for i, (method, world, params, workload) in enumerate(RUNS):
        text += ["[[run]]", f'method = "{method}"', f"world_size = {world}", f'label = "{method}-{i}"']
        if params:
            text.append(f"params = {_toml(params)}")
        if workload:
            text.append(f'workload = "{workload}"')
            if workload == "digits-resnet":
                text.append("workload_options = { depth = 8 }")
    return "\n".join(text) + "\n"


def test_the_runs_cover_every_registered_method():
    names = {name for name, ref in BUILTIN_METHODS.items() if name != "single"}
    assert names == {method for method, *_ in RUNS}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans")
    path = out / "plans.toml"
    path.write_text(_suite())
    from harness.cli import main

    printed = io.StringIO()  # in this process: the ranks fork from the session's warm server
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["run", str(path), "--out", str(out), "--quiet"])
    assert code == 0, printed.getvalue()[-8000:]
    found = {}
    for spec_file in (out / "plans").glob("*/spec.json"):
        label = json.loads(spec_file.read_text())["label"]
        records = [r for r in read_jsonl(spec_file.parent / "metrics.jsonl") if r.get("kind") == "memory"]
        found[label] = {r["when"]: r["per_rank"] for r in records}
    return found


#: The pipelines, whose plan walks the step's actions (methods/pipeline/core/step_bytes.py): its kinds are those of
#: the rank's worst moment (a backward or the update, with its transient as temporaries), while held gives each kind
#: at its own peak over the run. Activations and buffers rise and fall with the microbatches in flight, and peak at
#: another moment than the total (one microbatch more, just before a backward frees it), so they are held, together,
#: to what the worst moment holds for microbatches and transients. The kinds held throughout (and the gradients,
#: whole at every backward and at the update) are compared kind by kind.
WALKED = {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "pipedream", "pb", "qfb", "apapo"}


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(RUNS)), ids=[f"{m}-{i}" for i, (m, *_) in enumerate(RUNS)])
def test_the_plan_bounds_what_each_rank_held(plans, index):
    method = RUNS[index][0]
    memory = plans[f"{method}-{index}"]
    planned, held = memory["planned"], memory["held"]
    assert planned.keys() == held.keys() and planned
    for rank in planned:
        plan, measured = planned[rank], held[rank]
        assert measured["total"] > 0
        assert plan["total"] >= measured["total"], (rank, plan, measured)
        for kind in ("weights", "optimizer", "versions"):
            assert plan[kind] >= measured[kind], (rank, kind, plan, measured)
        if method in WALKED:  # the worst moment's gradients, microbatch bytes and transient against each kind's peak
            # (a rank of several stages may peak before its later stage's first backward made its gradients)
            moment = plan["gradients"] + plan["activations"] + plan["buffers"] + plan["temporaries"]
            assert moment >= measured["gradients"] + measured["activations"] + measured["buffers"], (rank, plan,
                                                                                                    measured)
        else:
            for kind in ("gradients", "buffers"):
                assert plan[kind] >= measured[kind], (rank, kind, plan, measured)
            # held counts the step's input among the saved tensors where the first block saves it; local's plan
            # counts it once, as inputs (its phases are profiled from that input: methods/local/local.py)
            saved = plan["activations"] + (plan["inputs"] if method == "local" else 0)
            assert saved >= measured["activations"], (rank, plan, measured)


#: Runs whose policy keeps weight versions besides the live ones (stashes, predictions, copies, double buffers).
KEEP_VERSIONS = [i for i, (m, _w, p, _wl) in enumerate(RUNS)
                 if m in ("pipedream", "apapo") or p.get("sync") in ("bounded", "ahead") or p.get("recompute") is False]


@pytest.mark.parametrize("index", KEEP_VERSIONS, ids=[f"{RUNS[i][0]}-{i}" for i in KEEP_VERSIONS])
def test_versions_are_planned_and_held_where_a_policy_keeps_them(plans, index):
    memory = plans[f"{RUNS[index][0]}-{index}"]
    assert max(r["versions"] for r in memory["planned"].values()) > 0
    assert max(r["versions"] for r in memory["held"].values()) > 0


def test_a_pipeline_without_step_schedules_plans_nothing_and_the_virtual_mode_plans_every_worker():
    """A plug-in pipeline that does not give schedule_at records no plan (and so cannot run under a budget); the
    virtual mode plans each emulated rank."""
    from _dist import context

    cls, ctx = context("gpipe", 0, 1, {"microbatches": 4, "stages": 3})
    method = cls(ctx)
    plans = method.memory_plan()
    assert sorted(plans) == [0, 1, 2] and all(p.total > 0 for p in plans.values())

    class NoSchedules(cls):
        def schedule_at(self, step):
            raise NotImplementedError("no step schedules")

    assert NoSchedules(ctx).memory_plan() is None
