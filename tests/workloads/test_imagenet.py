"""Tests of the ImageNet workload on a tiny generated ImageFolder: the lazy loader, its augmentation, the ResNet-50
blocks, the error messages, and one short run through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness.data import imagenet
from harness.data.tensors import Batch, DataOrder
from harness.models.resnet50 import resnet50 as resnet50_blocks

CLASSES = ("n01440764", "n01443537", "n01484850")
PER_CLASS = {"train": 4, "val": 2}
SIZE = 32


@pytest.fixture(autouse=True)
def no_env_root(monkeypatch):
    monkeypatch.delenv(imagenet.ENV_VAR, raising=False)


pytestmark = pytest.mark.usefixtures("one_thread")


def write_folder(folder: Path, classes=CLASSES, per_class=None) -> Path:
    """`folder`/train and /val with `classes` folders of 48x40 images: JPEGs, a PNG and a greyscale one each."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (per_class or PER_CLASS).items():
        for c, name in enumerate(classes):
            (folder / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
                path = folder / split / name / f"{split}_{c}_{i}"
                if i == 1:
                    Image.fromarray(pixels).save(f"{path}.png")
                elif i == 2:
                    Image.fromarray(pixels[..., c]).save(f"{path}.JPEG")  # greyscale, converted to RGB
                else:
                    Image.fromarray(pixels).save(f"{path}.JPEG", quality=95)
    return folder


@pytest.fixture
def root(tmp_path) -> Path:
    write_folder(tmp_path / "imagenet")
    return tmp_path


# --- the loader ---

def test_reads_the_image_folder_with_its_classes_and_labels(root):
    train, val = imagenet.load(str(root), SIZE)
    assert train.classes == val.classes == list(CLASSES)
    assert len(train) == 12 and len(val) == 6
    assert train.y.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and val.y.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(val.targets(torch.tensor([5, 0])), torch.tensor([2, 0]))
    assert val.targets(torch.arange(2)).dtype == torch.int64
    assert train.transform is not None and val.transform is None
    assert train.normalize is None and val.normalize is None
    for data in (train, val):
        x = data.inputs(torch.arange(len(data)))
        assert x.shape == (len(data), 3, SIZE, SIZE) and x.dtype == torch.float32
        assert torch.isfinite(x).all()


def test_val_is_a_resize_then_centre_crop_normalized(root):
    from PIL import Image

    _, val = imagenet.load(str(root), SIZE)
    first = val.inputs(torch.tensor([0]))
    assert torch.equal(first, val.inputs(torch.tensor([0]), torch.Generator().manual_seed(3)))
    image = Image.open(val.paths[0]).convert("RGB")  # 48 x 40: shorter side to int(32 * 256 / 224) = 36
    resized = image.resize((43, 36), Image.BILINEAR)
    top, left = 2, 6  # round((36 - 32) / 2), round((43 - 32) / 2) (to even)
    pixels = np.array(resized.crop((left, top, left + SIZE, top + SIZE)))
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (imagenet.MEAN, imagenet.STD))
    expected = (torch.from_numpy(pixels).permute(2, 0, 1) / 255 - mean) / std
    torch.testing.assert_close(first[0], expected, atol=1e-6, rtol=0)


def test_augmentation_is_reproducible_per_generator_and_differs_by_seed(root):
    train, _ = imagenet.load(str(root), SIZE)
    ids = torch.arange(len(train))
    first = train.inputs(ids, torch.Generator().manual_seed(1))
    assert torch.equal(first, train.inputs(ids, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, train.inputs(ids, torch.Generator().manual_seed(2)))
    assert not torch.equal(first, train.inputs(ids))  # without a generator: the evaluation transform
    assert torch.equal(train.inputs(ids), train.inputs(ids))


def test_decoding_threads_do_not_change_the_batch(root):
    train, _ = imagenet.load(str(root), SIZE)
    ids = torch.tensor([3, 7, 0, 11, 5])
    one = train.inputs(ids, torch.Generator().manual_seed(4))
    torch.set_num_threads(2)
    try:
        two = train.inputs(ids, torch.Generator().manual_seed(4))
    finally:
        torch.set_num_threads(1)
    assert torch.equal(one, two)


def test_batches_give_every_rank_the_same_augmented_samples(root):
    train, _ = imagenet.load(str(root), SIZE)
    order = DataOrder(len(train), 4, seed=0)
    batch = Batch(step=2, epoch=0.0, indices=order.batch(2), data=train, seed=0)
    full = batch.inputs()
    assert full.shape == (4, 3, SIZE, SIZE)
    (x0, y0), (x1, y1) = batch.shard(0, 2), batch.shard(1, 2)
    assert torch.equal(torch.cat([x0, x1]), full)
    assert torch.equal(torch.cat([y0, y1]), train.targets(batch.indices))
    assert torch.equal(Batch(2, 0.0, order.batch(2), train, seed=0).inputs(), full)
    assert not torch.equal(Batch(3, 0.0, order.batch(2), train, seed=0).inputs(), full)


def test_random_resized_crop_box_stays_inside_and_covers_the_scale_range():
    g = torch.Generator().manual_seed(0)
    boxes = [imagenet.random_resized_crop_box(40, 48, g) for _ in range(500)]
    for top, left, h, w in boxes:
        assert 0 <= top and top + h <= 40 and 0 <= left and left + w <= 48 and h > 0 and w > 0
    shares = [h * w / (40 * 48) for _, _, h, w in boxes]
    assert min(shares) < 0.15 and max(shares) > 0.85
    ratios = [w / h for _, _, h, w in boxes]
    assert min(ratios) > 0.7 and max(ratios) < 1.45
    # an image too thin for any box falls back to the largest centred box of ratio 3/4 or 4/3
    assert imagenet.random_resized_crop_box(10, 1000, torch.Generator().manual_seed(0),
                                            scale=(0.99, 1.0)) == (0, 493, 10, 13)


def test_root_itself_may_hold_train_and_val(tmp_path):
    write_folder(tmp_path / "mine")
    train, val = imagenet.load(str(tmp_path / "mine"), SIZE)
    assert len(train) == 12 and len(val) == 6


def test_the_imagenet_subfolder_is_tried_first(tmp_path):
    write_folder(tmp_path)  # root/train, root/val: 3 classes
    write_folder(tmp_path / "imagenet", classes=CLASSES[:2])
    assert imagenet.load(str(tmp_path), SIZE)[0].classes == list(CLASSES[:2])


def test_env_var_sets_the_root(root, monkeypatch):
    monkeypatch.setenv(imagenet.ENV_VAR, str(root))
    assert len(imagenet.load(None, SIZE)[0]) == 12


# --- errors ---

def test_missing_data_names_the_paths_tried_and_how_to_get_it(tmp_path):
    where = tmp_path / "nothing here"
    with pytest.raises(FileNotFoundError) as info:
        imagenet.load(str(where))
    message = str(info.value)
    for expected in (str(where / "imagenet" / "train"), str(where / "imagenet" / "val"), str(where / "train"),
                     "https://image-net.org", "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar",
                     "torchvision.datasets.ImageNet", "DTBENCH_DATA_ROOT", "data_root", "argument"):
        assert expected in message


def test_train_and_val_with_different_classes_are_refused(tmp_path):
    write_folder(tmp_path / "imagenet")
    (tmp_path / "imagenet" / "val" / CLASSES[2]).rename(tmp_path / "imagenet" / "val" / "n99999999")
    with pytest.raises(ValueError, match=r"1 are only in train/ \(n01484850\) and 1 only in val/ \(n99999999\)"):
        imagenet.load(str(tmp_path))


def test_an_empty_training_class_or_split_is_named(tmp_path):
    write_folder(tmp_path / "imagenet")
    (tmp_path / "imagenet" / "train" / "n00000000").mkdir()
    (tmp_path / "imagenet" / "val" / "n00000000").mkdir()
    with pytest.raises(ValueError, match="train is not an ImageFolder"):
        imagenet.load(str(tmp_path))
    write_folder(tmp_path / "empty-val", per_class={"train": 1, "val": 0})
    with pytest.raises(ValueError, match="val/ has class folders but no images"):
        imagenet.load(str(tmp_path / "empty-val"))


# --- the model and the workload ---

def test_resnet50_is_torchvision_s_as_18_blocks():
    from torchvision.models import resnet50
    from torchvision.models.resnet import Bottleneck

    torch.manual_seed(0)
    model = resnet50_blocks(3)
    assert type(model) is nn.Sequential and len(model) == 18
    assert all(isinstance(model[i], Bottleneck) for i in range(1, 17))
    assert isinstance(model[17][-1], nn.Linear) and model[17][-1].out_features == 3
    torch.manual_seed(0)
    reference = resnet50(weights=None, num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    model.eval(), reference.eval()
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        expected = reference(x)
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(model[9:](model[:9](x)), expected, rtol=0, atol=0)


def test_the_meta_model_has_imagenet_s_parameter_count():
    from harness import registry

    model = registry.WORKLOADS.get("imagenet-resnet50").meta_model()
    assert len(model) == 18 and all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's ResNet-50, 1000 classes


def test_the_workload_instantiates_and_its_model_forwards_a_batch(root):
    from harness import registry

    workload = registry.WORKLOADS.get("imagenet-resnet50")
    assert (workload.budget.max_epochs, workload.target) == (90, 0.75)
    assert workload.hyperparameters == {"batch_size": 256, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
    assert workload.Options().image_size == 224
    instance = workload.instantiate({"image_size": SIZE}, str(root))
    assert instance.classes == 3 and len(instance.train) == 12 and len(instance.test) == 6
    batch = Batch(step=0, epoch=0.0, indices=torch.arange(2), data=instance.train)
    model = instance.make_model()
    logits = model(batch.inputs())
    assert logits.shape == (2, 3)
    nn.functional.cross_entropy(logits, batch.targets()).backward()
    assert model[0][0].weight.grad is not None


def test_image_size_is_validated():
    from pydantic import ValidationError

    from harness import registry

    with pytest.raises(ValidationError):
        registry.WORKLOADS.get("imagenet-resnet50").Options.model_validate({"image_size": 8})


@pytest.mark.slow
def test_imagenet_resnet50_runs_through_the_cli(root, tmp_path):
    from harness.cli import main
    from harness.results import read_jsonl

    suite = tmp_path / "imagenet-tiny.toml"
    suite.write_text(f'name = "imagenet-tiny"\nworkload = "imagenet-resnet50"\nseeds = [0]\nthreads_per_rank = 1\n'
                     f'data_root = "{root}"\nworkload_options = {{image_size = {SIZE}}}\n'
                     f'[budget]\nmax_steps = 2\neval_every_epochs = 1\n'
                     f'[defaults]\nbatch_size = 4\nlr = 0.01\n[[run]]\nmethod = "sgd"\n')
    out = tmp_path / "results"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    records = read_jsonl(out / "imagenet-tiny" / "sgd-imagenet-resnet50-w1-s0" / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and all(0 <= r["test_accuracy"] <= 1 for r in evals)
