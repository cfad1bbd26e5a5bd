"""ImageNet from an ImageFolder on disk, decoded lazily per batch with seeded augmentation, and ResNet-50 as blocks."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from harness.data.cifar10 import ENV_VAR, resolve_root, root_source

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
DIR = "imagenet"
SPLITS = ("train", "val")
#: RandomResizedCrop's defaults (Szegedy et al. 2015): the crop's share of the image's area, its aspect ratio.
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
#: Evaluation resizes the shorter side to image_size * 256 / 224 (256 at 224) before the centre crop.
RESIZE_RATIO = 256 / 224
_ATTEMPTS = 10
_SEED_BOUND = 2 ** 62


def candidates(root: Path) -> list[Path]:
    """The folders tried, in order, for `<folder>/train/<class>/...` and `<folder>/val/<class>/...`."""
    return [root / DIR, root]


def load(data_root: str | None = None, image_size: int = 224) -> tuple[ImageFolderData, ImageFolderData]:
    """ImageNet's training and validation sets as lazily decoded ImageFolderData (train augments, val does not).

    Looks under the root (cifar10.resolve_root: data_root, else $DTBENCH_DATA_ROOT, else ~/.cache/dtbench/data)
    for `imagenet/train/` and `imagenet/val/`, then for `train/` and `val/` in the root itself; each holds one
    folder per class (the class is the folder's name, e.g. a WordNet id) of images. Labels are the class folders'
    sorted order, shared by both splits. Raises FileNotFoundError naming the paths tried and how to get the data,
    ValueError when the splits' class folders differ or a split has no images.
    """
    root = resolve_root(data_root)
    folder = next((f for f in candidates(root) if all((f / s).is_dir() for s in SPLITS)), None)
    if folder is None:
        raise FileNotFoundError(_missing_message(root, data_root))
    train = _scan(folder / "train", allow_empty=False)
    val = _scan(folder / "val", allow_empty=True)  # a subset's val may lack a class's images
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise ValueError(f"ImageNet under {folder}: train/ and val/ should hold the same class folders, but "
                         f"{len(only_train)} are only in train/ {_few(only_train)} and {len(only_val)} only in "
                         f"val/ {_few(only_val)}; sort the validation images into the training set's classes")
    if not val.samples:
        raise ValueError(f"ImageNet under {folder}: val/ has class folders but no images")
    return (ImageFolderData(train.samples, train.classes, image_size, train=True),
            ImageFolderData(val.samples, val.classes, image_size, train=False))


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f"({shown})" if names else ""


def _scan(split: Path, allow_empty: bool):
    from torchvision.datasets import ImageFolder  # imported here: torchvision is slow to import

    try:
        return ImageFolder(str(split), allow_empty=allow_empty)
    except FileNotFoundError as error:  # no class folder, or a class folder without images
        raise ValueError(f"ImageNet split {split} is not an ImageFolder of images ({error}). It should hold one "
                         f"folder per class, each with that class's images (.JPEG, .png, ...).") from error


def _missing_message(root: Path, data_root: str | None) -> str:
    source = root_source(data_root)
    tried = " and ".join(f"{f / 'train'}/ + {f / 'val'}/" for f in candidates(root))
    return (
        f"ImageNet not found under {root} (root from {source}). Looked for {tried} (one folder per class in "
        f"each). To get it: register at https://image-net.org/download.php and download the ILSVRC 2012 archives "
        f"ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz into {root / DIR}, "
        f"then run python -c 'import torchvision; [torchvision.datasets.ImageNet(\"{root / DIR}\", split=s) "
        f"for s in (\"train\", \"val\")]' once (it unpacks both and sorts val/ into class folders; needs scipy). "
        f"To use another folder, pass data_root = \"...\" in the suite file or set {ENV_VAR}."
    )


class ImageFolderData:
    """A split of an ImageFolder, decoded on demand: the lazy counterpart of TensorData, with its interface.

    `inputs(indices, generator)` opens, decodes and transforms those images into a float N x 3 x S x S batch
    (S = `image_size`), normalized with ImageNet's channel mean and std. With a generator and `train`, each image
    gets RandomResizedCrop(S) and a random horizontal flip, drawn from a seed the generator gives that image, so
    the batch is the same whatever the decoding threads' order, for every method and rank given (seed, step).
    Otherwise (validation, or training inputs asked for without a generator, e.g. a method's example batch)
    each image is resized to S * 256 / 224 on its shorter side and centre-cropped to S. `targets(indices)` and
    `y` are int64 labels; `classes` the class folders' names. There is no `x`: the images stay on disk.
    `transform` is non-None for training, which tells Batch to pass its generator; it is `augment`, one image's
    augmentation (a PIL image and a generator), not a batch's. `normalize` is None: inputs come normalized.
    Decoding uses torch.get_num_threads() threads (PIL releases the GIL while it decodes).
    """

    normalize = None

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], image_size: int = 224,
                 train: bool = False):
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.paths = [path for path, _ in samples]
        self.y = torch.tensor([label for _, label in samples], dtype=torch.int64)
        self.classes = list(classes)
        self.image_size = image_size
        self.train = train
        self.transform = self.augment if train else None

    def __len__(self) -> int:
        return len(self.paths)

    def targets(self, indices: torch.Tensor) -> torch.Tensor:
        return self.y[indices]

    def inputs(self, indices: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        ids = torch.as_tensor(indices, dtype=torch.long).reshape(-1).tolist()
        if self.train and generator is not None:
            seeds = torch.randint(0, _SEED_BOUND, (len(ids),), generator=generator).tolist()
            jobs = [(self.paths[i], seed) for i, seed in zip(ids, seeds, strict=True)]
        else:
            jobs = [(self.paths[i], None) for i in ids]
        if not jobs:
            return torch.empty(0, 3, self.image_size, self.image_size)
        threads = min(len(jobs), max(1, torch.get_num_threads()))
        if threads == 1:
            return torch.stack([self._one(job) for job in jobs])
        with ThreadPoolExecutor(threads) as pool:
            return torch.stack(list(pool.map(self._one, jobs)))

    def _one(self, job: tuple[str, int | None]) -> torch.Tensor:
        path, seed = job
        image = open_rgb(path)
        if seed is None:
            image = centre_crop(image, self.image_size)
        else:
            image = self.augment(image, torch.Generator().manual_seed(seed))
        return to_normalized_tensor(image)

    def augment(self, image: Any, generator: torch.Generator) -> Any:
        """One PIL image's training augmentation: RandomResizedCrop(image_size), then a flip with probability 1/2."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as TF

        top, left, height, width = random_resized_crop_box(image.height, image.width, generator)
        size = [self.image_size, self.image_size]
        image = TF.resized_crop(image, top, left, height, width, size, InterpolationMode.BILINEAR, antialias=True)
        if torch.rand((), generator=generator).item() < 0.5:
            image = TF.hflip(image)
        return image


def open_rgb(path: str) -> Any:
    """The image at `path`, decoded, as an RGB PIL image (greyscale and CMYK files converted)."""
    from PIL import Image

    with open(path, "rb") as f, Image.open(f) as image:
        return image.convert("RGB")


def random_resized_crop_box(height: int, width: int, generator: torch.Generator,
                            scale: tuple[float, float] = SCALE,
                            ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random crop covering a `scale` share of the area with an aspect ratio
    (width / height) log-uniform in `ratio`, all drawn from `generator`. After _ATTEMPTS boxes that do not fit,
    the largest centred box whose ratio lies in `ratio` (the usual fallback)."""
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_ATTEMPTS):
        u = torch.rand(2, generator=generator).tolist()
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        aspect = math.exp(log_low + (log_high - log_low) * u[1])
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return top, left, h, w
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def centre_crop(image: Any, image_size: int) -> Any:
    """Evaluation's transform of one PIL image: shorter side to image_size * 256 / 224, centre crop image_size."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    image = TF.resize(image, int(image_size * RESIZE_RATIO), InterpolationMode.BILINEAR, antialias=True)
    return TF.center_crop(image, [image_size, image_size])


def to_normalized_tensor(image: Any) -> torch.Tensor:
    """A PIL RGB image as a float 3 x H x W tensor in [0, 1], normalized with ImageNet's channel mean and std."""
    from torchvision.transforms import functional as TF

    return TF.normalize(TF.to_tensor(image), MEAN, STD)
