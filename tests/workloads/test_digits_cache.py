"""The digits cache holds numbers, not code: a planted or corrupt cache file is reported in one line and rebuilt, and
an ordinary run over it neither runs it nor fails."""

from __future__ import annotations

import os
import pickle

import torch

from harness.data import sources


class _Planted:
    """Unpickling this runs a command (the classic pickle payload): here it writes a marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.CACHE_VARIABLE, str(tmp_path / "cache"))
    from importlib import metadata

    return sources.digits_cache_file(0, 0.2, metadata.version("scikit-learn"))


def test_a_planted_pickle_is_not_run_and_the_split_is_rebuilt(tmp_path, monkeypatch, capfd):
    path = _cache_file(tmp_path, monkeypatch)
    reference_train, reference_test = sources.digits()  # builds and keeps the file
    assert path.is_file()
    marker = tmp_path / "ran"
    path.write_bytes(pickle.dumps({"x_train": _Planted(str(marker))}))
    capfd.readouterr()
    train, test = sources.digits()
    assert not marker.exists()  # torch.load(weights_only=True) refused the call; a plain pickle.load would run it
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "rebuilt" in err
    assert torch.equal(train.x, reference_train.x) and torch.equal(test.y, reference_test.y)
    # rebuilt in place: the next read is quiet
    sources.digits()
    assert capfd.readouterr().err == ""


def test_a_file_of_the_wrong_tensors_is_rebuilt(tmp_path, monkeypatch, capfd):
    path = _cache_file(tmp_path, monkeypatch)
    path.parent.mkdir(parents=True)
    torch.save({"x_train": torch.zeros(3, 1, 8, 8), "y_train": torch.zeros(3, dtype=torch.long),
                "x_test": torch.zeros(2, 1, 8, 8), "y_test": torch.full((2,), 42, dtype=torch.long)}, path)
    train, _ = sources.digits()
    assert len(train.y) > 1000 and "rebuilt" in capfd.readouterr().err


def test_an_ordinary_run_over_a_planted_cache_does_not_run_it(tmp_path, monkeypatch, dtbench_here):
    """The reported attack end to end: a pickle planted at the cache's path, then a plain `dtbench run` (its ranks
    load the digits)."""
    path = _cache_file(tmp_path, monkeypatch)
    marker = tmp_path / "ran"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        pickle.dump({"x_train": _Planted(str(marker))}, f)
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\nseeds = [0]\n[budget]\nmax_steps = 2\n'
                     '[[run]]\nmethod = "sgd"\n')
    result = dtbench_here("run", suite, "--out", tmp_path / "out", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists()
    log = (tmp_path / "out" / "s" / "sgd-digits-mlp-w1-s0" / "logs" / "rank0.log").read_text()
    assert "ignored a digits cache file" in log
