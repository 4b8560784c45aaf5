"""Tests of feddr_kit.data: loading (real CIFAR-10, image folders, synthetic), the tensor
cache, augmentation/normalization, and every bad input raising FeddrKitError."""

import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from feddr_kit import data
from feddr_kit.errors import FeddrKitError

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]


def jpeg_root() -> Path:
    return Path(os.environ["FEDDR_DATA_DIR"]) / "cifar10-jpeg"


def write_image(path: Path, size=(8, 8), colour=(200, 30, 60), mode="RGB", fmt=None) -> None:
    """Write a small solid-colour image file (format from the suffix unless fmt is given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = colour if mode != "L" else colour[0]
    Image.new(mode, size, fill).save(path, format=fmt)


def make_folder(root: Path, classes=("a", "b"), per_class=3, size=(8, 8), suffix=".png") -> Path:
    """A tiny train/<class>/ + test/<class>/ tree with distinct colours per class."""
    for split in ("train", "test"):
        for c, name in enumerate(classes):
            for i in range(per_class):
                write_image(root / split / name / f"{i:02d}{suffix}", size,
                            (40 * c + 20, 10 * i, 255 - 40 * c))
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private, empty cache folder for image-folder tests."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FEDDR_CACHE_DIR", str(folder))
    return folder


# --------------------------------------------------------------------------------------
# real CIFAR-10
# --------------------------------------------------------------------------------------

def test_cifar10_shapes_and_classes(cifar10):
    assert cifar10.name == "cifar10"
    assert cifar10.classes == CIFAR10_CLASSES and cifar10.num_classes == 10
    assert cifar10.train_x.shape == (50_000, 3, 32, 32) and cifar10.test_x.shape == (10_000, 3, 32, 32)
    assert cifar10.train_x.dtype == torch.uint8 and cifar10.train_x.is_contiguous()
    assert cifar10.test_x.dtype == torch.uint8 and cifar10.test_x.is_contiguous()
    assert cifar10.train_y.dtype == torch.int64 and cifar10.test_y.dtype == torch.int64
    assert torch.bincount(cifar10.train_y).tolist() == [5000] * 10
    assert torch.bincount(cifar10.test_y).tolist() == [1000] * 10
    assert cifar10.image_shape == (3, 32, 32)
    assert cifar10.mean.dtype == torch.float32 and cifar10.mean.shape == (3,)
    assert cifar10.std.dtype == torch.float32 and cifar10.std.shape == (3,)


def test_cifar10_mean_std_match_an_exact_histogram_reference(cifar10):
    """Reference from each channel's pixel-value histogram (exact integer counts)."""
    values = torch.arange(256, dtype=torch.float64) / 255
    for c in range(3):
        hist = torch.bincount(cifar10.train_x[:, c].flatten(), minlength=256).double()
        mean = (hist * values).sum() / hist.sum()
        std = ((hist * (values - mean) ** 2).sum() / hist.sum()).sqrt()
        assert abs(cifar10.mean[c].item() - mean.item()) < 1e-6
        assert abs(cifar10.std[c].item() - std.item()) < 1e-6


@pytest.mark.parametrize("split", ["train", "test"])
def test_cifar10_pixels_and_labels_match_the_files(cifar10, split):
    """Decode a few files directly with Pillow; the tensor at the ImageFolder position
    (sorted classes, then sorted file names) must hold those pixels and that label."""
    rng = np.random.default_rng(7)
    x, y = (cifar10.train_x, cifar10.train_y) if split == "train" else (cifar10.test_x, cifar10.test_y)
    per_class = len(y) // 10
    for c in rng.choice(10, size=4, replace=False):
        files = sorted(os.listdir(jpeg_root() / split / CIFAR10_CLASSES[c]))
        for pos in rng.choice(len(files), size=3, replace=False):
            idx = c * per_class + pos
            with Image.open(jpeg_root() / split / CIFAR10_CLASSES[c] / files[pos]) as im:
                ref = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
            assert y[idx].item() == c
            # Same JPEG decoder family; allow a rounding step in case the builds differ.
            assert (x[idx].int() - ref.int()).abs().max().item() <= 2


def test_imagefolder_load_gives_identical_tensors(cifar10):
    folder = data.load("imagefolder", path=jpeg_root())
    assert folder.name == "imagefolder:cifar10-jpeg"
    assert folder.classes == cifar10.classes
    for field in ("train_x", "train_y", "test_x", "test_y", "mean", "std"):
        assert torch.equal(getattr(folder, field), getattr(cifar10, field)), field


def test_cached_cifar10_load_is_under_two_seconds(cifar10):
    start = time.perf_counter()
    again = data.load("cifar10")
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"cached load took {elapsed:.2f} s"
    assert torch.equal(again.train_x, cifar10.train_x)


def test_train_batch_and_normalize_on_cifar10(cifar10):
    idx = torch.arange(0, 50_000, 997)
    batch = cifar10.train_batch(idx, torch.Generator().manual_seed(0))
    assert batch.shape == (len(idx), 3, 32, 32) and batch.dtype == torch.float32
    z = cifar10.normalize(cifar10.train_x[::10])  # strided: the data is class-blocked
    assert z.dtype == torch.float32
    assert torch.allclose(z.mean(dim=(0, 2, 3)), torch.zeros(3), atol=0.05)
    assert torch.allclose(z.std(dim=(0, 2, 3)), torch.ones(3), atol=0.05)


# --------------------------------------------------------------------------------------
# augmentation
# --------------------------------------------------------------------------------------

def candidate_views(img: torch.Tensor) -> dict:
    """All 9x9 crops of the 4-pixel zero-padded image, with and without horizontal flip."""
    _, h, w = img.shape
    padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
    views = {}
    for dy in range(9):
        for dx in range(9):
            crop = padded[:, dy:dy + h, dx:dx + w]
            views[(dy, dx, False)] = crop
            views[(dy, dx, True)] = crop.flip(-1)
    return views


def identify(out: torch.Tensor, img: torch.Tensor) -> tuple:
    matches = [k for k, v in candidate_views(img).items() if torch.equal(v, out)]
    assert len(matches) == 1, "augmented image is not a unique crop/flip of its input"
    return matches[0]


@pytest.fixture(scope="module")
def noise_data():
    """A synthetic ImageData whose train images are random noise (crops identify uniquely)."""
    d = data.load("synthetic", num_classes=2, train_per_class=32, test_per_class=2)
    noise = torch.randint(0, 256, d.train_x.shape, generator=torch.Generator().manual_seed(3),
                          dtype=torch.uint8)
    return data.ImageData(d.name, noise, d.train_y, d.test_x, d.test_y, d.classes, d.mean, d.std)


def test_augment_is_a_padded_crop_and_flip_of_each_image(noise_data):
    x = noise_data.train_x
    out = noise_data.augment(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == torch.uint8
    keys = [identify(o, i) for o, i in zip(out, x)]
    assert len({k[2] for k in keys}) == 2, "both flip states should occur in 64 images"
    assert len({k[:2] for k in keys}) > 10, "crop offsets should vary"


def test_augment_is_reproducible_and_seed_dependent(noise_data):
    x = noise_data.train_x
    a = noise_data.augment(x, torch.Generator().manual_seed(5))
    b = noise_data.augment(x, torch.Generator().manual_seed(5))
    c = noise_data.augment(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, x), "augmentation should change images"


def test_flip_of_flip_and_identity_crop(noise_data):
    x = noise_data.train_x
    out = noise_data.augment(x, torch.Generator().manual_seed(2))
    for o, i in zip(out, x):
        dy, dx, flipped = identify(o, i)
        if (dy, dx) == (4, 4):  # centred crop: the image itself, or its mirror
            assert torch.equal(o.flip(-1) if flipped else o, i)
        if flipped:  # undoing the flip gives the plain crop
            assert torch.equal(o.flip(-1), candidate_views(i)[(dy, dx, False)])


def test_zero_padding_shows_up_at_the_border(noise_data):
    """With the same generator seed the draws do not depend on pixel values, so an all-255
    batch gets the offsets identified on the noise batch: zeros exactly in the padded rows."""
    x = noise_data.train_x
    keys = [identify(o, i) for o, i in
            zip(noise_data.augment(x, torch.Generator().manual_seed(9)), x)]
    white = torch.full_like(x, 255)
    out = noise_data.augment(white, torch.Generator().manual_seed(9))
    assert (out == 0).any()
    for o, (dy, dx, flipped) in zip(out, keys):
        expected = torch.full_like(o, 255)
        expected[:, :max(0, 4 - dy)] = 0
        expected[:, 32 - max(0, dy - 4):] = 0
        expected[:, :, :max(0, 4 - dx)] = 0
        expected[:, :, 32 - max(0, dx - 4):] = 0
        assert torch.equal(o, expected.flip(-1) if flipped else expected)


def test_augment_empty_batch_and_default_generator(noise_data):
    empty = noise_data.train_x[:0]
    assert noise_data.augment(empty).shape == empty.shape
    assert noise_data.augment(noise_data.train_x[:4]).shape == (4, 3, 32, 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_augment_on_cuda_matches_shape_and_is_reproducible(noise_data):
    d = noise_data.to("cuda")
    a = d.augment(d.train_x, torch.Generator(device="cuda").manual_seed(0))
    b = d.augment(d.train_x, torch.Generator(device="cuda").manual_seed(0))
    assert a.device.type == "cuda" and torch.equal(a, b)
    for o, i in zip(a.cpu()[:8], noise_data.train_x[:8]):
        identify(o, i)
    with pytest.raises(FeddrKitError, match="generator"):
        d.augment(d.train_x, torch.Generator().manual_seed(0))


def test_normalize_formula_and_to(noise_data):
    x = noise_data.train_x[:4]
    z = noise_data.normalize(x)
    ref = (x.float() / 255 - noise_data.mean[:, None, None]) / noise_data.std[:, None, None]
    assert torch.allclose(z, ref, atol=1e-6)
    moved = noise_data.to("cpu")
    assert torch.equal(moved.train_x, noise_data.train_x) and moved.name == noise_data.name


# --------------------------------------------------------------------------------------
# synthetic
# --------------------------------------------------------------------------------------

def test_synthetic_shapes_determinism_and_learnability():
    d = data.load("synthetic", num_classes=4, train_per_class=30, test_per_class=10,
                  image_size=16, seed=3)
    assert "synthetic" in d.name and "NOT real" in d.name
    assert d.train_x.shape == (120, 3, 16, 16) and d.test_x.shape == (40, 3, 16, 16)
    assert d.train_x.dtype == torch.uint8 and d.train_y.dtype == torch.int64
    assert torch.bincount(d.train_y).tolist() == [30] * 4 and d.num_classes == 4
    same = data.load("synthetic", num_classes=4, train_per_class=30, test_per_class=10,
                     image_size=16, seed=3)
    other = data.load("synthetic", num_classes=4, train_per_class=30, test_per_class=10,
                      image_size=16, seed=4)
    assert torch.equal(d.train_x, same.train_x) and not torch.equal(d.train_x, other.train_x)
    # Class-dependent content: a nearest-class-mean rule beats chance (25%) by far.
    feats = lambda x: d.normalize(x).flatten(1)
    centroids = torch.stack([feats(d.train_x[d.train_y == c]).mean(0) for c in range(4)])
    pred = torch.cdist(feats(d.test_x), centroids).argmin(1)
    assert (pred == d.test_y).float().mean() > 0.6


# --------------------------------------------------------------------------------------
# image folders and the cache
# --------------------------------------------------------------------------------------

def test_imagefolder_small_tree_labels_and_cache(tmp_path, cache, monkeypatch):
    root = make_folder(tmp_path / "tiny", classes=("b_cls", "a_cls"), per_class=3, size=(12, 10))
    d = data.load("imagefolder", path=root)
    assert d.name == "imagefolder:tiny" and d.classes == ["a_cls", "b_cls"]
    assert d.train_x.shape == (6, 3, 10, 12) and d.train_y.tolist() == [0, 0, 0, 1, 1, 1]
    with Image.open(root / "train" / "b_cls" / "01.png") as im:
        ref = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(d.train_x[4], ref)
    assert d.augment(d.train_x).shape == d.train_x.shape  # non-square images augment too
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt", "one cache file, no temp leftovers"

    def no_decode(*a, **k):
        raise AssertionError("should have come from the cache")

    monkeypatch.setattr(data, "_decode_folder", no_decode)
    again = data.load("imagefolder", path=root)
    assert torch.equal(again.train_x, d.train_x) and torch.equal(again.mean, d.mean)


def test_imagefolder_cache_invalidated_when_files_change(tmp_path, cache):
    root = make_folder(tmp_path / "tiny")
    first = data.load("imagefolder", path=root)
    write_image(root / "train" / "a" / "99.png", colour=(1, 2, 3))
    second = data.load("imagefolder", path=root)
    assert len(second.train_y) == len(first.train_y) + 1
    target = root / "test" / "b" / "00.png"
    write_image(target, colour=(9, 9, 9))
    os.utime(target, ns=(1, 1))  # different mtime, same size
    third = data.load("imagefolder", path=root)
    assert not torch.equal(third.test_x, second.test_x)
    assert len(list(cache.glob("*.pt"))) == 1, "stale cache files of the same folder are removed"
    # a folder with the same name elsewhere keeps its own cache beside it
    other = make_folder(tmp_path / "elsewhere" / "tiny")
    data.load("imagefolder", path=other)
    assert len(list(cache.glob("*.pt"))) == 2
    assert torch.equal(data.load("imagefolder", path=root).test_x, third.test_x)
    assert len(list(cache.glob("*.pt"))) == 2


def test_corrupt_cache_file_is_decoded_again(tmp_path, cache):
    root = make_folder(tmp_path / "tiny")
    first = data.load("imagefolder", path=root)
    (cache_file,) = cache.glob("*.pt")
    cache_file.write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="unreadable cache"):
        again = data.load("imagefolder", path=root)
    assert torch.equal(again.train_x, first.train_x)


def test_grayscale_rgba_and_jpeg_become_rgb(tmp_path, cache):
    root = make_folder(tmp_path / "mixed", per_class=1)
    write_image(root / "train" / "a" / "gray.png", mode="L", colour=(77, 0, 0))
    write_image(root / "train" / "a" / "rgba.png", mode="RGBA", colour=(1, 2, 3, 4))
    write_image(root / "train" / "b" / "photo.jpg", colour=(10, 200, 30))
    write_image(root / "train" / "b" / "old.bmp", colour=(5, 6, 7))
    d = data.load("imagefolder", path=root)
    assert d.train_x.shape == (6, 3, 8, 8)
    gray = d.train_x[1]  # sorted: a/00.png, a/gray.png, a/rgba.png, b/00.png, b/old.bmp, ...
    assert (gray == 77).all()
    assert (d.train_x[4] == torch.tensor([5, 6, 7], dtype=torch.uint8)[:, None, None]).all()


def test_relative_data_dir_falls_back_to_the_repo_root(tmp_path, monkeypatch):
    repo = Path(data.__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDDR_DATA_DIR", "data")  # not in tmp_path, but in the repo
    assert data.data_dir() == repo / "data"
    (tmp_path / "data").mkdir()
    assert data.data_dir() == Path("data"), "the current folder wins when it has the path"
    assert data.data_dir(root=tmp_path) == tmp_path


def test_cifar10_from_torchvision_files_is_preferred(tmp_path, monkeypatch):
    """A data dir with cifar-10-batches-py goes through torchvision (here: a stub)."""
    (tmp_path / "cifar-10-batches-py").mkdir()
    calls = []

    def fake(name, cls_name, folder, download):
        calls.append((name, cls_name, Path(folder), download))
        return data.load("synthetic")

    monkeypatch.setattr(data, "_load_torchvision", fake)
    data.load("cifar10", root=tmp_path)
    assert calls == [("cifar10", "CIFAR10", tmp_path, False)]


# --------------------------------------------------------------------------------------
# bad inputs: each raises FeddrKitError naming the argument
# --------------------------------------------------------------------------------------

def test_bad_dataset_name():
    with pytest.raises(FeddrKitError, match=r"^name: unknown dataset 'mnist'; allowed"):
        data.load("mnist")


def test_imagefolder_without_path():
    with pytest.raises(FeddrKitError, match=r"^path: load\('imagefolder'\) needs path="):
        data.load("imagefolder")


def test_imagefolder_missing_folder(tmp_path):
    with pytest.raises(FeddrKitError, match=r"^path: folder .* does not exist"):
        data.load("imagefolder", path=tmp_path / "nope")


def test_imagefolder_path_is_a_file(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(FeddrKitError, match=r"^path: .* is not a folder"):
        data.load("imagefolder", path=tmp_path / "f.txt")


def test_imagefolder_empty_folder(tmp_path):
    with pytest.raises(FeddrKitError, match=r"^path: .* has no train/ folder"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_without_test_split(tmp_path):
    write_image(tmp_path / "train" / "a" / "0.png")
    with pytest.raises(FeddrKitError, match=r"^path: .* has no test/ folder"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_files_directly_in_train(tmp_path):
    make_folder(tmp_path)
    write_image(tmp_path / "train" / "loose.png")
    with pytest.raises(FeddrKitError, match=r"^path: file train/loose.png lies directly in train/"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_split_without_class_folders(tmp_path):
    make_folder(tmp_path)
    for f in (tmp_path / "test").rglob("*.png"):
        f.unlink()
    for d in (tmp_path / "test").iterdir():
        d.rmdir()
    with pytest.raises(FeddrKitError, match=r"^path: test/ in .* has no class folders"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_class_lists_differ(tmp_path):
    make_folder(tmp_path)
    write_image(tmp_path / "test" / "c" / "0.png")
    with pytest.raises(FeddrKitError, match=r"^path: train/ and test/ must have the same class "
                                            r"folders; only in train: \[\], only in test: \['c'\]"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_class_folder_without_images(tmp_path, cache):
    make_folder(tmp_path)
    (tmp_path / "train" / "c").mkdir()
    (tmp_path / "test" / "c").mkdir()
    (tmp_path / "train" / "c" / "readme.txt").write_text("no images here")
    with pytest.raises(FeddrKitError, match=r"^path: train/ of .*no valid file.*\bc\b"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_unreadable_image(tmp_path, cache):
    make_folder(tmp_path)
    (tmp_path / "train" / "b" / "broken.jpg").write_bytes(b"this is not a jpeg")
    with pytest.raises(FeddrKitError, match=r"^path: cannot read image train/b/broken.jpg"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_mixed_sizes(tmp_path, cache):
    make_folder(tmp_path)
    write_image(tmp_path / "train" / "b" / "big.png", size=(16, 16))
    with pytest.raises(FeddrKitError, match=r"^path: image train/b/big.png is 16x16 but the first "
                                            r"is 8x8; all images must be one size"):
        data.load("imagefolder", path=tmp_path)


def test_imagefolder_train_and_test_sizes_differ(tmp_path, cache):
    make_folder(tmp_path / "t1", size=(8, 8))
    make_folder(tmp_path / "t2", size=(6, 6))
    (tmp_path / "t1" / "test").rename(tmp_path / "t1" / "test_old")
    (tmp_path / "t2" / "test").rename(tmp_path / "t1" / "test")
    with pytest.raises(FeddrKitError, match=r"^path: train images are \(8, 8\) but test images"):
        data.load("imagefolder", path=tmp_path / "t1")


def test_unknown_keyword_for_cifar10():
    with pytest.raises(FeddrKitError, match=r"^num_classes: load\('cifar10'\) takes no such keyword"):
        data.load("cifar10", num_classes=5)


def test_path_given_for_cifar10(tmp_path):
    with pytest.raises(FeddrKitError, match=r"^path: only used with name='imagefolder'"):
        data.load("cifar10", path=tmp_path)


@pytest.mark.parametrize("kw, arg", [({"num_classes": 1}, "num_classes"),
                                     ({"train_per_class": 0}, "train_per_class"),
                                     ({"image_size": 4}, "image_size"),
                                     ({"seed": -1}, "seed"),
                                     ({"num_classes": 2.5}, "num_classes")])
def test_synthetic_bad_values(kw, arg):
    with pytest.raises(FeddrKitError, match=rf"^{arg}: must be an integer >= "):
        data.load("synthetic", **kw)


def test_synthetic_unknown_keyword():
    with pytest.raises(FeddrKitError, match=r"^classes: not a synthetic-data keyword; allowed: "
                                            r"num_classes"):
        data.load("synthetic", classes=3)


def test_cifar100_missing_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDR_DATA_DIR", str(tmp_path))
    with pytest.raises(FeddrKitError, match=r"^root: cifar100 not found in .* and download=False; "
                                            r"set FEDDR_DATA_DIR .*cifar-100-python/ or "
                                            r"cifar100-jpeg/"):
        data.load("cifar100", download=False)


def test_cifar100_offline_download_fails_fast_and_cleanly(tmp_path, monkeypatch):
    """Simulate no network (DNS fails, as here), so the test never downloads when online."""
    def no_dns(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setenv("FEDDR_DATA_DIR", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(FeddrKitError, match=r"^root: cifar100 not found in .* and the download "
                                            r"failed .*go online$") as info:
        data.load("cifar100")
    assert time.perf_counter() - start < 5
    assert info.value.__suppress_context__, "no urllib traceback should be chained"
    assert "\n" not in str(info.value)
    assert socket.getdefaulttimeout() is None, "the download timeout must be restored"


def test_corrupt_torchvision_folder(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(FeddrKitError, match=r"^root: .*cifar-10-batches-py is incomplete or "
                                            r"corrupted"):
        data.load("cifar10", root=tmp_path)


@pytest.mark.parametrize("bad", [torch.zeros(2, 3, 8, 8), torch.zeros(3, 8, 8, dtype=torch.uint8),
                                 np.zeros((2, 3, 8, 8), dtype=np.uint8)])
def test_augment_rejects_non_uint8_batches(noise_data, bad):
    with pytest.raises(FeddrKitError, match=r"^x_uint8: expected a uint8 tensor \[B,3,H,W\]"):
        noise_data.augment(bad)


def test_normalize_rejects_float_input(noise_data):
    with pytest.raises(FeddrKitError, match=r"^x_uint8: expected a uint8 tensor"):
        noise_data.normalize(torch.zeros(1, 3, 32, 32))


def test_unset_data_dir_prefers_the_repo_data_then_a_shared_copy_beside_the_repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    monkeypatch.setattr(data, "REPO_ROOT", repo)
    monkeypatch.delenv("FEDDR_DATA_DIR", raising=False)
    assert data.data_dir() == repo / "data"  # nothing beside the repo
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data.data_dir() == tmp_path / "shared" / "data"  # repo data/ is empty: the shared copy
    (repo / "data" / "cifar10-jpeg").mkdir()
    assert data.data_dir() == repo / "data"  # a dataset of its own wins
