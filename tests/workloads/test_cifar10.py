"""Tests of the CIFAR-10 loader (both on-disk layouts, on tiny generated data) and its augmentation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from harness.data import cifar10
from harness.data.tensors import Batch, TensorData

NUM_TRAIN, NUM_TEST = 20, 10


@pytest.fixture
def fake():
    """Tiny random CIFAR-shaped data: (x_train, y_train, x_test, y_test), uint8 N x 3 x 32 x 32 and int64."""
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (NUM_TRAIN, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, NUM_TRAIN),
            rng.integers(0, 256, (NUM_TEST, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, NUM_TEST))


@pytest.fixture(autouse=True)
def no_env_root(monkeypatch):
    monkeypatch.delenv(cifar10.ENV_VAR, raising=False)


def assert_loaded(train: TensorData, test: TensorData, fake) -> None:
    x_train, y_train, x_test, y_test = fake
    assert train.x.dtype == test.x.dtype == torch.uint8
    assert train.y.dtype == test.y.dtype == torch.int64
    assert train.x.shape == (NUM_TRAIN, 3, 32, 32) and test.x.shape == (NUM_TEST, 3, 32, 32)
    assert torch.equal(train.x, torch.from_numpy(x_train)) and torch.equal(test.x, torch.from_numpy(x_test))
    assert torch.equal(train.y, torch.from_numpy(y_train)) and torch.equal(test.y, torch.from_numpy(y_test))
    assert train.normalize == test.normalize == (cifar10.MEAN, cifar10.STD)
    assert train.transform is cifar10.augment and test.transform is None


def save_hf(root, fake, image_column: str = "img", as_pil: bool = False) -> None:
    import datasets
    from PIL import Image

    def split(x, y):
        if as_pil:
            images = [Image.fromarray(image.transpose(1, 2, 0)) for image in x]
            feature = datasets.Image()
        else:
            images, feature = x, datasets.Array3D(shape=(3, 32, 32), dtype="uint8")
        label = datasets.ClassLabel(names=list(cifar10.CLASSES))
        features = datasets.Features({image_column: feature, "label": label})
        return datasets.Dataset.from_dict({image_column: images, "label": y}, features=features)

    x_train, y_train, x_test, y_test = fake
    splits = datasets.DatasetDict(train=split(x_train, y_train), test=split(x_test, y_test))
    splits.save_to_disk(str(root / cifar10.HF_DIR))


# --- loading ---

def test_torchvision_layout_round_trips_exactly(tmp_path, fake):
    folder = cifar10.write_torchvision_format(tmp_path, *fake)
    assert folder == tmp_path / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"])
    assert_loaded(*cifar10.load(str(tmp_path)), fake)


def test_reads_python2_style_pickles_with_bytes_keys_and_numpy_core(tmp_path, fake):
    x_train, y_train, x_test, y_test = fake
    folder = tmp_path / cifar10.TORCHVISION_DIR
    folder.mkdir()
    parts = np.array_split(np.arange(NUM_TRAIN), 5)
    batches = {f"data_batch_{i + 1}": (x_train[idx], y_train[idx]) for i, idx in enumerate(parts)}
    batches["test_batch"] = (x_test, y_test)
    for name, (x, y) in batches.items():
        entry = pickle.dumps({b"data": x.reshape(len(x), -1), b"labels": [int(v) for v in y]}, protocol=2)
        # the real files were written by numpy 1 (numpy.core); numpy 2 writes numpy._core
        (folder / name).write_bytes(entry.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    assert_loaded(*cifar10.load(str(tmp_path)), fake)


def test_hf_layout_with_array3d_features(tmp_path, fake):
    save_hf(tmp_path, fake)
    assert_loaded(*cifar10.load(str(tmp_path)), fake)


def test_hf_layout_with_pil_images_in_an_image_column(tmp_path, fake):
    save_hf(tmp_path, fake, image_column="image", as_pil=True)
    assert_loaded(*cifar10.load(str(tmp_path)), fake)


def test_torchvision_layout_is_tried_first(tmp_path, fake):
    save_hf(tmp_path, fake)
    x_train, y_train, x_test, y_test = fake
    other = (255 - x_train, (y_train + 1) % 10, 255 - x_test, (y_test + 1) % 10)
    cifar10.write_torchvision_format(tmp_path, *other)
    assert_loaded(*cifar10.load(str(tmp_path)), other)


def test_env_var_sets_the_root_and_the_argument_overrides_it(tmp_path, fake, monkeypatch):
    cifar10.write_torchvision_format(tmp_path / "env", *fake)
    monkeypatch.setenv(cifar10.ENV_VAR, str(tmp_path / "env"))
    assert_loaded(*cifar10.load(None), fake)
    with pytest.raises(FileNotFoundError, match="argument"):
        cifar10.load(str(tmp_path / "elsewhere"))


def test_default_root_is_under_the_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cifar10.resolve_root(None) == tmp_path / ".cache" / "dtbench" / "data"
    assert cifar10.resolve_root("~/x") == tmp_path / "x"


def test_missing_data_error_names_the_paths_and_how_to_get_the_data(tmp_path):
    root = tmp_path / "nothing here"
    with pytest.raises(FileNotFoundError) as info:
        cifar10.load(str(root))
    message = str(info.value)
    for expected in (str(root / "cifar-10-batches-py"), str(root / "cifar10"),
                     "https://www.cs.toronto.edu/~kriz/cifar.html", "cifar-10-python.tar.gz", "save_to_disk",
                     "DTBENCH_DATA_ROOT", "data_root"):
        assert expected in message


def test_corrupt_batch_file_is_named(tmp_path, fake):
    folder = cifar10.write_torchvision_format(tmp_path, *fake)
    (folder / "data_batch_3").write_bytes(b"this is not a pickle")
    with pytest.raises(ValueError, match="data_batch_3"):
        cifar10.load(str(tmp_path))


def test_missing_batch_file_is_named(tmp_path, fake):
    folder = cifar10.write_torchvision_format(tmp_path, *fake)
    (folder / "test_batch").unlink()
    with pytest.raises(ValueError, match="test_batch is missing"):
        cifar10.load(str(tmp_path))


def test_batch_file_with_code_is_refused(tmp_path, fake):
    folder = cifar10.write_torchvision_format(tmp_path, *fake)
    with (folder / "data_batch_1").open("wb") as f:
        pickle.dump({"data": print, "labels": []}, f)
    with pytest.raises(ValueError, match="builtins.print"):
        cifar10.load(str(tmp_path))


def test_out_of_range_labels_are_refused(tmp_path, fake):
    x_train, y_train, x_test, y_test = fake
    cifar10.write_torchvision_format(tmp_path, x_train, y_train, x_test, np.full_like(y_test, 10))
    with pytest.raises(ValueError, match="test_batch.*0..9"):
        cifar10.load(str(tmp_path))


def test_hf_layout_without_a_label_column_is_named(tmp_path, fake):
    import datasets

    x = datasets.Dataset.from_dict({"img": fake[0]}, features=datasets.Features(
        {"img": datasets.Array3D(shape=(3, 32, 32), dtype="uint8")}))
    datasets.DatasetDict(train=x, test=x).save_to_disk(str(tmp_path / "cifar10"))
    with pytest.raises(ValueError, match="'label'"):
        cifar10.load(str(tmp_path))


# --- augmentation ---

def reference_crop_flip(x: torch.Tensor, top, left, flip, padding: int, fill) -> torch.Tensor:
    """A per-sample loop doing what random_crop_flip should do, given its draws."""
    n, channels, height, width = x.shape
    out = []
    for i in range(n):
        padded = torch.empty(channels, height + 2 * padding, width + 2 * padding)
        padded[:] = torch.as_tensor(fill).view(channels, 1, 1)
        padded[:, padding:padding + height, padding:padding + width] = x[i]
        crop = padded[:, top[i]:top[i] + height, left[i]:left[i] + width]
        out.append(crop.flip(2) if flip[i] else crop)
    return torch.stack(out)


def draws(n: int, seed: int, padding: int = cifar10.PADDING):
    g = torch.Generator().manual_seed(seed)
    top = torch.randint(0, 2 * padding + 1, (n,), generator=g)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=g)
    return top, left, torch.randint(0, 2, (n,), generator=g).bool()


def test_augment_matches_a_per_sample_reference():
    x = torch.randn(64, 3, 32, 32)
    out = cifar10.augment(x, torch.Generator().manual_seed(5))
    expected = reference_crop_flip(x, *draws(64, 5), cifar10.PADDING, cifar10.PIXEL_ZERO)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_augment_keeps_shape_and_dtype():
    x = torch.randn(7, 3, 32, 32)
    out = cifar10.augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype


def test_augment_is_reproducible_and_depends_on_the_seed():
    x = torch.randn(16, 3, 32, 32)
    first = cifar10.augment(x, torch.Generator().manual_seed(1))
    again = cifar10.augment(x, torch.Generator().manual_seed(1))
    other = cifar10.augment(x, torch.Generator().manual_seed(2))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_augment_covers_all_offsets_and_both_flips():
    # pixel value 100 * row + column, so the centre pixel of a crop reveals its shift and its flip
    index_image = (100 * torch.arange(32.0)[:, None] + torch.arange(32.0)[None, :]).expand(500, 3, 32, 32)
    out = cifar10.augment(index_image, torch.Generator().manual_seed(3))
    centre = out[:, 0, 16, 16]
    row_shift = torch.div(centre, 100, rounding_mode="floor") - 16
    flipped = out[:, 0, 16, 17] < centre
    column_shift = torch.where(flipped, centre % 100 - 15, centre % 100 - 16)
    shifts = set(range(-cifar10.PADDING, cifar10.PADDING + 1))
    assert set(row_shift.long().tolist()) == shifts
    assert set(column_shift.long().tolist()) == shifts
    assert 0.4 < flipped.float().mean().item() < 0.6


def test_padding_equals_black_padding_in_pixel_space(tmp_path, fake):
    # TensorData normalizes before it augments; the fill must make that equal to pad-in-pixels-then-normalize.
    cifar10.write_torchvision_format(tmp_path, *fake)
    train, _ = cifar10.load(str(tmp_path))
    indices = torch.arange(NUM_TRAIN)
    got = train.inputs(indices, torch.Generator().manual_seed(9))
    pixels = train.x.float() / 255
    cropped = cifar10.random_crop_flip(pixels, torch.Generator().manual_seed(9))  # zero (black) padding
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (cifar10.MEAN, cifar10.STD))
    torch.testing.assert_close(got, (cropped - mean) / std)
    # some sample was actually shifted, so the padding was exercised
    assert (cropped == 0).any()


def test_train_batches_augment_and_test_sets_do_not(tmp_path, fake):
    cifar10.write_torchvision_format(tmp_path, *fake)
    train, test = cifar10.load(str(tmp_path))
    indices = torch.arange(8)
    batch = Batch(step=3, epoch=0.0, indices=indices, data=train, seed=1)
    plain = train.inputs(indices)
    assert not torch.equal(batch.inputs(), plain)
    torch.testing.assert_close(batch.inputs(), Batch(3, 0.0, indices, train, seed=1).inputs(), rtol=0, atol=0)
    x, y = batch.shard(1, 2)
    torch.testing.assert_close(x, batch.inputs()[4:], rtol=0, atol=0)
    torch.testing.assert_close(test.inputs(torch.arange(4)), test.inputs(torch.arange(4), torch.Generator()))


def test_the_cifar10_resnet20_workload_builds_from_a_data_root(tmp_path, fake):
    from harness import registry

    cifar10.write_torchvision_format(tmp_path, *fake)
    instance = registry.WORKLOADS.get("cifar10-resnet20").instantiate(data_root=str(tmp_path))
    assert len(instance.train) == NUM_TRAIN and len(instance.test) == NUM_TEST
    batch = Batch(step=0, epoch=0.0, indices=torch.arange(4), data=instance.train)
    logits = instance.make_model().eval()(batch.inputs())
    assert logits.shape == (4, 10)


@pytest.mark.parametrize("layout", ["torchvision", "hf"])
def test_both_layouts_train_a_deeper_resnet_through_the_workload(tmp_path, fake, layout):
    from harness import registry

    if layout == "torchvision":
        cifar10.write_torchvision_format(tmp_path, *fake)
    else:
        save_hf(tmp_path, fake, image_column="image", as_pil=True)
    instance = registry.WORKLOADS.get("cifar10-resnet").instantiate({"depth": 56}, str(tmp_path))
    assert len(instance.train) == NUM_TRAIN and len(instance.test) == NUM_TEST
    torch.manual_seed(0)
    model = instance.make_model()
    assert len(model) == 3 * 9 + 2 and sum(p.numel() for p in model.parameters()) == 853_018
    batch = Batch(step=0, epoch=0.0, indices=torch.arange(8), data=instance.train)
    x, y = batch.shard(0, 1)
    assert torch.equal(y, torch.from_numpy(fake[1][:8]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = instance.loss(model(x), y)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and model.eval()(instance.test.inputs(torch.arange(4))).shape == (4, 10)


@pytest.mark.slow
def test_the_hf_layout_runs_the_cifar10_resnet_workload_through_the_cli(tmp_path, fake):
    from harness.cli import main
    from harness.results import read_jsonl

    save_hf(tmp_path / "data", fake)
    suite = tmp_path / "cifar-hf.toml"
    suite.write_text(f'name = "cifar-hf"\nworkload = "cifar10-resnet"\nseeds = [0]\nthreads_per_rank = 1\n'
                     f'data_root = "{tmp_path / "data"}"\n[budget]\nmax_steps = 2\neval_every_epochs = 1\n'
                     f'[defaults]\nbatch_size = 8\nlr = 0.01\n'
                     f'[[run]]\nmethod = "sgd"\nworkload_options = {{depth = 8, norm = "group"}}\n')
    out = tmp_path / "results"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    (run,) = (out / "cifar-hf").glob("sgd-cifar10-resnet-*")
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    assert any(r["kind"] == "eval" for r in records)
