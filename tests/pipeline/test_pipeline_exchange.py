"""gpipe's and 1f1b's `exchange`: 'fused' (receives posted at their action, sends completed with the receive that
follows) runs without deadlock on 3 and 4 ranks and gives bitwise the same training and bytes as 'prepost'; it is
refused where it is not deadlock-free (replicas, several stages per rank) with one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.results import read_jsonl

ROOT = Path(__file__).resolve().parents[2]

HEAD = """name = "ex"
workload = "synthetic-mlp"
workload_options = { depth = 4 }
seeds = [0]
threads_per_rank = 1
hang_timeout_s = 20
[budget]
max_steps = 5
eval_every_epochs = 100
[defaults]
batch_size = 32
lr = 0.05
"""


def _records(run_dir: Path) -> list[tuple]:
    keep = ("loss", "bytes_sent", "bytes_recv")
    return sorted((r["rank"], r["step"], *(r.get(k) for k in keep))
                  for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train")


@pytest.mark.slow
def test_fused_exchange_trains_as_prepost_bitwise_without_deadlock(tmp_path, dtbench_here):
    runs = ""
    for method, world in (("gpipe", 3), ("1f1b", 3), ("1f1b", 4)):
        for exchange in ("prepost", "fused"):
            runs += (f'[[run]]\nmethod = "{method}"\nworld_size = {world}\nlabel = "{method}-{world}-{exchange}"\n'
                     f'params = {{ exchange = "{exchange}", microbatches = 4 }}\n')
    path = tmp_path / "ex.toml"
    path.write_text(HEAD + runs)
    proc = dtbench_here("run", str(path), "--out", str(tmp_path / "out"), "--quiet", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    suite = tmp_path / "out" / "ex"
    for method, world in (("gpipe", 3), ("1f1b", 3), ("1f1b", 4)):
        pre, fused = (next(suite.glob(f"{method}-{world}-{exchange}-*")) for exchange in ("prepost", "fused"))
        ours, theirs = _records(pre), _records(fused)
        assert len(ours) == 5 * world and ours == theirs, (method, world)
        assert any(r[3] for r in ours)  # bytes moved and were counted, alike in both


@pytest.mark.parametrize("params,world,needle", [
    ('{ exchange = "fused", replicas = [2, 1] }', 3, "exchange = 'fused' needs one replica per stage"),
    ('{ exchange = "fused", stages = 2 }', 3, "exchange = 'fused' needs one stage per rank"),
    ('{ exchange = "eager" }', 2, "run[0].params.exchange"),
])
def test_fused_exchange_is_refused_where_it_could_deadlock(tmp_path, capsys, params, world, needle):
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + f'[[run]]\nmethod = "1f1b"\nworld_size = {world}\nparams = {params}\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path}: " in err and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_interleaved_and_pipedream_do_not_take_exchange(tmp_path, capsys):
    for method in ("interleaved-1f1b", "pipedream"):
        path = tmp_path / f"{method}.toml"
        path.write_text(HEAD + f'[[run]]\nmethod = "{method}"\nworld_size = 2\nparams = {{ exchange = "fused" }}\n')
        assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
        assert "exchange" in capsys.readouterr().err
