"""Datasets held in memory: sklearn's digits (the embedded default) and teacher-labelled synthetic data."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import torch

from harness.data.tensors import TensorData

CACHE_VARIABLE = "DTBENCH_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/dtbench/cache"


def cache_dir() -> Path:
    """Where derived data is cached between runs: $DTBENCH_CACHE_DIR, else ~/.cache/dtbench/cache."""
    return Path(os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE).expanduser()


def digits(seed_split: int = 0, test_fraction: float = 0.2) -> tuple[TensorData, TensorData]:
    """sklearn's digits (1797 8x8 images, 10 classes), shipped inside scikit-learn: a fixed stratified split.

    Pixels (0..16) are scaled to [0, 1] and centred by the training mean. Shape N x 1 x 8 x 8.

    The split is made once per machine and kept on disk (joblib.Memory under cache_dir(), keyed by the arguments,
    scikit-learn's version and the code of `digits_split`), so that later runs, and each of their ranks, skip
    importing scikit-learn (about 0.8 s a process). The tensors are the same bit for bit either way; where the
    cache cannot be written, the split is made in memory.
    """
    version = metadata.version("scikit-learn")
    try:
        from joblib import Memory

        split = Memory(cache_dir(), verbose=0).cache(digits_split)
    except OSError:
        split = digits_split
    x_train, y_train, x_test, y_test = split(seed_split, test_fraction, version)
    return TensorData(x_train, y_train), TensorData(x_test, y_test)


def digits_split(seed_split: int, test_fraction: float, sklearn_version: str) -> tuple[torch.Tensor, ...]:
    """The digits split as four tensors (train x, train y, test x, test y); `sklearn_version` only keys the
    cache."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(range(len(y)), test_size=test_fraction, stratify=bunch.target,
                                           random_state=seed_split)
    train_idx, test_idx = torch.tensor(sorted(train_idx)), torch.tensor(sorted(test_idx))
    mean = x[train_idx].mean()
    std = x[train_idx].std()
    x = (x - mean) / std
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx]


def synthetic(num_train: int, num_test: int, in_features: int, classes: int, seed: int = 1234) -> tuple[
        TensorData, TensorData]:
    """Gaussian inputs labelled by a fixed random two-layer teacher: learnable, sized at will, no files."""
    g = torch.Generator().manual_seed(seed)
    n = num_train + num_test
    x = torch.randn(n, in_features, generator=g)
    hidden = max(classes, min(256, in_features))
    w1 = torch.randn(in_features, hidden, generator=g) / in_features ** 0.5
    w2 = torch.randn(hidden, classes, generator=g) / hidden ** 0.5
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return TensorData(x[:num_train], y[:num_train]), TensorData(x[num_train:], y[num_train:])
