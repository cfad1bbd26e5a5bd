"""Datasets held in memory: sklearn's digits (the embedded default) and teacher-labelled synthetic data."""

from __future__ import annotations

import os
import sys
import warnings
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

    The split is made once per machine and kept on disk as tensors (digits_cache_file: keyed by the arguments,
    scikit-learn's version and the code of `digits_split`), so that later runs, and each of their ranks, skip
    importing scikit-learn (about 0.8 s a process). The file is read with torch.load(weights_only=True), which
    builds tensors and plain containers and runs no code, and checked for the split's shapes and types: a corrupt or
    planted file gets one line on stderr and is rebuilt. The tensors are the same bit for bit either way; where the
    cache cannot be written, the split is made in memory.
    """
    version = metadata.version("scikit-learn")
    path = digits_cache_file(seed_split, test_fraction, version)
    split = _read_split(path)
    if split is None:
        split = digits_split(seed_split, test_fraction, version)
        _write_split(path, split)
    x_train, y_train, x_test, y_test = split
    return TensorData(x_train, y_train), TensorData(x_test, y_test)


def digits_cache_file(seed_split: int, test_fraction: float, sklearn_version: str) -> Path:
    """Where the digits split with these arguments is kept: <cache_dir()>/digits/<key>.pt, the key a sha256 of
    the arguments, scikit-learn's version and the source of digits_split (a changed split makes a new file)."""
    import hashlib
    import inspect

    key = hashlib.sha256(repr((seed_split, test_fraction, sklearn_version)).encode())
    key.update(inspect.getsource(digits_split).encode())
    return cache_dir() / "digits" / f"{key.hexdigest()[:32]}.pt"


def _read_split(path: Path) -> tuple[torch.Tensor, ...] | None:
    """The four tensors of a cached split, or None when there is none; a file that does not load as the split's
    tensors is reported in one line and ignored (the caller rebuilds and replaces it)."""
    if not path.exists():
        return None
    try:
        with warnings.catch_warnings():  # torch's note on the pickle protocol of a foreign file: the line below says
            warnings.simplefilter("ignore")
            saved = torch.load(path, weights_only=True)
        split = tuple(saved[name] for name in _SPLIT_NAMES)
        _check_split(split)
    except Exception as exc:  # noqa: BLE001 - whatever a corrupt or planted file fails with: rebuilt
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        print(f"dtbench: {path}: ignored a digits cache file that is not the split's tensors ({reason}); rebuilt",
              file=sys.stderr, flush=True)
        return None
    return split


_SPLIT_NAMES = ("x_train", "y_train", "x_test", "y_test")


def _check_split(split: tuple) -> None:
    """ValueError unless `split` is the digits split's four tensors: N x 1 x 8 x 8 floats and N long labels in
    0..9, 1797 samples in all."""
    x_train, y_train, x_test, y_test = split
    for x, y in ((x_train, y_train), (x_test, y_test)):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            raise ValueError("not tensors")
        if x.dtype != torch.float32 or y.dtype != torch.long or x.shape[1:] != (1, 8, 8) or y.shape != x.shape[:1]:
            raise ValueError(f"shapes {tuple(x.shape)} and {tuple(y.shape)}, types {x.dtype} and {y.dtype}")
        if len(y) and (int(y.min()) < 0 or int(y.max()) > 9):
            raise ValueError("labels outside 0..9")
    if len(y_train) + len(y_test) != 1797:
        raise ValueError(f"{len(y_train) + len(y_test)} samples, not 1797")


def _write_split(path: Path, split: tuple[torch.Tensor, ...]) -> None:
    """Keep the split at `path` (written aside, then renamed: a reader never sees half a file; concurrent ranks
    each write their own and the last rename wins). Where the cache cannot be written, nothing is kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(dict(zip(_SPLIT_NAMES, split, strict=True)), tmp)
        os.replace(tmp, path)
    except OSError:
        return


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
