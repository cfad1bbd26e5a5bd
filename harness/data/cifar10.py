"""CIFAR-10 from local files (torchvision pickles or a Hugging Face folder) and its training augmentation."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from harness.data.tensors import TensorData

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
ENV_VAR = "DTBENCH_DATA_ROOT"
DEFAULT_ROOT = "~/.cache/dtbench/data"
TORCHVISION_DIR = "cifar-10-batches-py"
HF_DIR = "cifar10"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
PADDING = 4
# Black (pixel value 0) after normalization: the fill that makes padding on normalized inputs equal to the
# usual zero padding in pixel space, since TensorData normalizes before it augments.
PIXEL_ZERO = tuple(-m / s for m, s in zip(MEAN, STD, strict=True))


def resolve_root(data_root: str | os.PathLike | None = None) -> Path:
    """The data root: `data_root` if given, else $DTBENCH_DATA_ROOT, else ~/.cache/dtbench/data."""
    root = data_root if data_root not in (None, "") else os.environ.get(ENV_VAR) or DEFAULT_ROOT
    return Path(root).expanduser()


def root_source(data_root: str | os.PathLike | None = None) -> str:
    """Where `resolve_root` took the root from, in words for an error message."""
    if data_root not in (None, ""):
        return "the data_root argument"
    if os.environ.get(ENV_VAR):
        return f"${ENV_VAR}"
    return f"the default; set ${ENV_VAR} or data_root to change it"


def load(data_root: str | None = None) -> tuple[TensorData, TensorData]:
    """CIFAR-10 (train 50,000, test 10,000) as uint8 N x 3 x 32 x 32 inputs and int64 labels.

    Looks under the root (see `resolve_root`) for, in order:
      a. `cifar-10-batches-py/` as unpacked from cifar-10-python.tar.gz (the layout torchvision uses);
      b. `cifar10/`, a Hugging Face DatasetDict written with save_to_disk (splits train/test, image column
         `img` or `image`, label column `label`).
    Both sets normalize with the usual CIFAR-10 channel mean and std; the training set also augments
    (`augment`: random 32x32 crop with 4-pixel black padding and a random horizontal flip).
    Raises FileNotFoundError naming the paths tried and how to get the data, ValueError for a corrupt file.
    """
    root = resolve_root(data_root)
    torchvision_dir = root / TORCHVISION_DIR
    hf_dir = root / HF_DIR
    if torchvision_dir.is_dir():
        (x_train, y_train), (x_test, y_test) = _load_torchvision(torchvision_dir)
    elif hf_dir.is_dir():
        (x_train, y_train), (x_test, y_test) = _load_hf(hf_dir)
    else:
        raise FileNotFoundError(_missing_message(root, data_root))
    normalize = (MEAN, STD)
    return (TensorData(x_train, y_train, transform=augment, normalize=normalize),
            TensorData(x_test, y_test, normalize=normalize))


def _missing_message(root: Path, data_root: str | None) -> str:
    source = root_source(data_root)
    return (
        f"CIFAR-10 not found under {root} (root from {source}). Looked for {root / TORCHVISION_DIR}/ "
        f"(torchvision layout) and {root / HF_DIR}/ (Hugging Face save_to_disk layout). To get it, on a "
        f"machine with internet: download cifar-10-python.tar.gz from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html and unpack it into {root} "
        f"(tar xzf cifar-10-python.tar.gz -C {root}), or run "
        f"python -c 'import datasets; datasets.load_dataset(\"cifar10\").save_to_disk(\"{root / HF_DIR}\")' "
        f"and copy the folder here. To use another folder, pass data_root = \"...\" in the suite file or set "
        f"{ENV_VAR}."
    )


# --- layout a: torchvision's python pickles ---

_NUMPY_MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                  "numpy._core.numeric"}
_NUMPY_NAMES = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}
_OTHER_GLOBALS = {("_codecs", "encode")}  # how Python 3 writes bytes (the array buffer) at pickle protocol 2


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays, so a batch file cannot run code."""

    def find_class(self, module: str, name: str):
        if (module in _NUMPY_MODULES and name in _NUMPY_NAMES) or (module, name) in _OTHER_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} (a CIFAR batch holds only arrays, "
                                     f"lists and strings)")


def _field(entry: dict, key: str):
    """A batch dict's field whether its keys are bytes (Python 2 pickles) or str (Python 3 ones)."""
    if key.encode() in entry:
        return entry[key.encode()]
    return entry[key]


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images N x 3 x 32 x 32 uint8, labels N int64) of one CIFAR-10 python batch file."""
    if not path.is_file():
        raise ValueError(f"CIFAR-10 folder {path.parent} is incomplete: {path.name} is missing. "
                         f"Unpack cifar-10-python.tar.gz again.")
    try:
        with path.open("rb") as f:
            entry = _BatchUnpickler(f, encoding="bytes").load()
        data = np.asarray(_field(entry, "data"))
        labels = np.asarray(_field(entry, "labels"), dtype=np.int64)
    except Exception as error:  # any failure here means the file is not a CIFAR batch
        raise ValueError(f"{path} is not a valid CIFAR-10 batch ({type(error).__name__}: {error}). "
                         f"Delete {path.parent} and unpack cifar-10-python.tar.gz again.") from error
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: 'data' should be N x 3072 uint8, got {data.shape} {data.dtype}")
    if labels.shape != (len(data),):
        raise ValueError(f"{path}: {len(labels)} labels for {len(data)} images")
    _check_labels(labels, path)
    return data.reshape(-1, 3, 32, 32), labels


Split = tuple[torch.Tensor, torch.Tensor]  # (images N x 3 x 32 x 32 uint8, labels N int64)


def _load_torchvision(folder: Path) -> tuple[Split, Split]:
    train = [_read_batch(folder / name) for name in TRAIN_BATCHES]
    x_test, y_test = _read_batch(folder / TEST_BATCH)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return _tensors(x_train, y_train), _tensors(x_test, y_test)


def write_torchvision_format(root: str | os.PathLike, x_train, y_train, x_test, y_test) -> Path:
    """Write images (N x 3 x 32 x 32 or N x 3072, uint8) and labels as `<root>/cifar-10-batches-py/`.

    The training set is split over data_batch_1..5 as in the real archive; batches.meta names the classes.
    Returns the folder written. Meant for tests and for converting CIFAR-10 from other sources.
    """
    folder = Path(root).expanduser() / TORCHVISION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    x_train, x_test = _as_rows(x_train, "x_train"), _as_rows(x_test, "x_test")
    y_train, y_test = np.asarray(y_train, dtype=np.int64), np.asarray(y_test, dtype=np.int64)
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError(f"images and labels differ in length: train {len(x_train)} vs {len(y_train)}, "
                         f"test {len(x_test)} vs {len(y_test)}")
    splits = np.array_split(np.arange(len(x_train)), len(TRAIN_BATCHES))
    for i, (name, idx) in enumerate(zip(TRAIN_BATCHES, splits, strict=True)):
        _write_batch(folder / name, f"training batch {i + 1} of 5", x_train[idx], y_train[idx])
    _write_batch(folder / TEST_BATCH, "testing batch 1 of 1", x_test, y_test)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({"num_cases_per_batch": len(splits[0]), "label_names": list(CLASSES), "num_vis": 3072}, f)
    return folder


def _as_rows(images, name: str) -> np.ndarray:
    array = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.dtype != np.uint8 or array.shape[1:] not in ((3, 32, 32), (3072,)):
        raise ValueError(f"{name} should be uint8 N x 3 x 32 x 32 or N x 3072, got {array.shape} "
                         f"{array.dtype}")
    return np.ascontiguousarray(array.reshape(len(array), 3072))


def _write_batch(path: Path, batch_label: str, images: np.ndarray, labels: np.ndarray) -> None:
    entry = {"batch_label": batch_label, "labels": [int(v) for v in labels], "data": images,
             "filenames": [f"image_{i}.png" for i in range(len(labels))]}
    with path.open("wb") as f:
        pickle.dump(entry, f)


# --- layout b: a Hugging Face DatasetDict saved to disk ---

def _load_hf(folder: Path) -> tuple[Split, Split]:
    import datasets  # imported here: it is slow to import and only this layout needs it

    try:
        splits = datasets.load_from_disk(str(folder))
    except Exception as error:  # report any failure as a bad folder
        raise ValueError(f"{folder} is not a readable Hugging Face dataset folder ({type(error).__name__}: "
                         f"{error}). Write it with DatasetDict.save_to_disk.") from error
    if not isinstance(splits, datasets.DatasetDict) or not {"train", "test"} <= set(splits):
        found = list(splits) if isinstance(splits, datasets.DatasetDict) else "a single Dataset"
        raise ValueError(f"{folder} should hold a DatasetDict with splits 'train' and 'test', found {found}")
    return _hf_split(splits["train"], folder / "train"), _hf_split(splits["test"], folder / "test")


def _hf_split(split, where: Path) -> Split:
    import datasets

    image_column = next((c for c in ("img", "image") if c in split.column_names), None)
    if image_column is None or "label" not in split.column_names:
        raise ValueError(f"{where}: expected an image column 'img' or 'image' and a column 'label', "
                         f"found {split.column_names}")
    feature = split.features[image_column]
    # Decoded images and uint8 arrays convert straight to uint8; anything else is range-checked first.
    exact = isinstance(feature, datasets.Image) or getattr(feature, "dtype", None) == "uint8"
    images = split.select_columns([image_column])
    images = images.with_format("numpy", dtype=np.uint8) if exact else images.with_format("numpy")
    x = images[:][image_column]
    if not isinstance(x, np.ndarray) or x.dtype == object:
        raise ValueError(f"{where}: images of different shapes or modes in column {image_column!r}; "
                         f"expected 32x32 RGB")
    if not exact:
        if x.size and (x.min() < 0 or x.max() > 255 or not np.array_equal(x, np.round(x))):
            raise ValueError(f"{where}: column {image_column!r} should hold pixel values 0..255, "
                             f"found {x.dtype} values in [{x.min()}, {x.max()}]")
        x = x.astype(np.uint8)
    if x.shape[1:] == (32, 32, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.shape[1:] != (3, 32, 32):
        raise ValueError(f"{where}: images should be 3 x 32 x 32 or 32 x 32 x 3 (RGB), got {x.shape[1:]}")
    y = np.asarray(split.with_format("numpy", columns=["label"])[:]["label"], dtype=np.int64)
    _check_labels(y, where)
    return _tensors(np.ascontiguousarray(x), y)


# --- shared ---

def _check_labels(labels: np.ndarray, where: Path) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"{where}: labels should be 0..9, found [{labels.min()}, {labels.max()}]")


def _tensors(x: np.ndarray, y: np.ndarray) -> Split:
    return torch.from_numpy(x), torch.from_numpy(y)


# --- augmentation ---

def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = PADDING,
                     fill: torch.Tensor | None = None) -> torch.Tensor:
    """Per sample: pad `padding` pixels on each side, crop H x W at a random offset, flip left-right w.p. 1/2.

    x: N x C x H x W. `fill`: per-channel pad value (C), zeros if None. One randint draw each for the row
    offsets, the column offsets and the flips (N each), all from `generator`, so a seed fixes the result.
    """
    n, channels, height, width = x.shape
    if fill is None:
        padded = F.pad(x, (padding, padding, padding, padding))
    else:
        padded = fill.to(x).view(1, channels, 1, 1).expand(n, channels, height + 2 * padding,
                                                           width + 2 * padding).clone()
        padded[:, :, padding:padding + height, padding:padding + width] = x
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    flip = torch.randint(0, 2, (n,), generator=generator).bool().to(x.device)
    rows = top[:, None] + torch.arange(height, device=x.device)                   # N x H
    cols = torch.arange(width, device=x.device).expand(n, width)
    cols = torch.where(flip[:, None], width - 1 - cols, cols) + left[:, None]     # N x W
    samples = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(channels, device=x.device)[None, :, None, None]
    return padded[samples, channel, rows[:, None, :, None], cols[:, None, None, :]]


def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The standard CIFAR-10 training augmentation on a normalized batch (N x 3 x 32 x 32).

    Random crop with 4-pixel padding and random horizontal flip. TensorData applies `normalize` before
    `transform`, so the padding is filled with normalized black (`PIXEL_ZERO`): the result equals zero padding
    in pixel space followed by normalization, as in torchvision's RandomCrop -> ToTensor -> Normalize.
    """
    return random_crop_flip(x, generator, PADDING, torch.tensor(PIXEL_ZERO))
