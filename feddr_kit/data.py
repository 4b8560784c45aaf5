"""Datasets as uint8 tensors, plus batched augmentation and normalization on the device.

``load(name)`` returns an :class:`ImageData`: the whole train and test split as one uint8
tensor each (``[N,3,H,W]``), int64 labels, class names and the train set's channel
mean/std. Training code gathers index batches from it and augments/normalizes them on the
training device (:meth:`ImageData.train_batch`), so no DataLoader and no per-image Python
runs in the training loop.

Where the data comes from (``FEDDR_DATA_DIR``, default: the repo's ``data/``):

* ``"cifar10"`` / ``"cifar100"``: torchvision's files (``cifar-10-batches-py`` /
  ``cifar-100-python``) if present; else an image folder ``cifar10-jpeg`` /
  ``cifar100-jpeg``; else a torchvision download (online only).
* ``"imagefolder"`` (``path=``): any ``train/<class>/*`` + ``test/<class>/*`` tree, decoded
  once and cached as a tensor file (``FEDDR_CACHE_DIR``, default the repo's ``data/cache``).
* ``"synthetic"``: generated offline from a seed; for smoke tests only, NOT real data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import socket
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import progress
from .errors import FeddrKitError
from .rundir import torch_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("cifar10", "cifar100", "imagefolder", "synthetic")
PAD = 4  # pixels of zero padding before the random crop (RandomCrop(32, padding=4))
_CACHE_FORMAT = 1  # bump when the cache file's content changes meaning
_DOWNLOAD_TIMEOUT_S = 30.0  # per socket operation; only so an offline download cannot hang
_SYNTHETIC_DEFAULTS = dict(num_classes=10, train_per_class=100, test_per_class=20,
                           image_size=32, seed=0)
_TORCHVISION = {
    "cifar10": ("CIFAR10", "cifar-10-batches-py", "cifar10-jpeg"),
    "cifar100": ("CIFAR100", "cifar-100-python", "cifar100-jpeg"),
}


# --------------------------------------------------------------------------------------
# ImageData
# --------------------------------------------------------------------------------------

@dataclass(repr=False)
class ImageData:
    """A whole image classification dataset held as tensors.

    ``train_x``/``test_x`` are uint8 ``[N,3,H,W]`` (contiguous), ``train_y``/``test_y`` int64
    ``[N]``; ``mean``/``std`` are float32 ``[3]`` channel statistics of ``train_x / 255``.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[str]
    mean: torch.Tensor
    std: torch.Tensor

    @property
    def num_classes(self) -> int:
        """Number of classes, ``len(classes)``."""
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(channels, height, width)`` of one image."""
        return tuple(self.train_x.shape[1:])

    @property
    def device(self) -> torch.device:
        """Device the images live on."""
        return self.train_x.device

    def __repr__(self) -> str:
        c, h, w = self.image_shape
        return (f"ImageData({self.name!r}, train={len(self.train_y)}, test={len(self.test_y)}, "
                f"image={c}x{h}x{w}, classes={self.num_classes}, device={self.device})")

    def to(self, device: str | torch.device) -> "ImageData":
        """Return a copy with every tensor moved to ``device`` (no copy if already there)."""
        moved = {f.name: getattr(self, f.name).to(device)
                 for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)

    def normalize(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """Map uint8 images ``[B,3,H,W]`` to ``(x/255 - mean)/std`` in the default dtype (float32) on ``x``'s device."""
        _check_batch(x_uint8, "x_uint8")
        mean = self.mean.to(x_uint8.device)[:, None, None]
        std = self.std.to(x_uint8.device)[:, None, None]
        return x_uint8.to(torch.get_default_dtype()).div_(255.0).sub_(mean).div_(std)

    def augment(self, x_uint8: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Random crop (4-pixel zero padding) + random horizontal flip of a uint8 batch.

        Takes uint8 ``[B,3,H,W]`` and returns uint8 ``[B,3,H,W]`` on the same device. Each
        image gets its own crop offset and flip, all drawn from ``generator`` (which must
        live on ``x``'s device), so a seeded generator reproduces the batch exactly.
        """
        _check_batch(x_uint8, "x_uint8")
        if generator is not None and generator.device.type != x_uint8.device.type:
            raise FeddrKitError(f"generator: lives on {generator.device} but x_uint8 is on "
                                f"{x_uint8.device}; create it with torch.Generator(device=x.device)")
        b, c, h, w = x_uint8.shape
        dev = x_uint8.device
        padded = x_uint8.new_zeros((b, c, h + 2 * PAD, w + 2 * PAD))
        padded[:, :, PAD:PAD + h, PAD:PAD + w] = x_uint8
        dy = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=dev)
        dx = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=dev)
        flip = torch.randint(0, 2, (b,), generator=generator, device=dev).bool()
        ar_h = torch.arange(h, device=dev)
        ar_w = torch.arange(w, device=dev)
        rows = dy[:, None] + ar_h                                            # [B,H]
        cols = dx[:, None] + torch.where(flip[:, None], w - 1 - ar_w, ar_w)  # [B,W]
        bi = torch.arange(b, device=dev)[:, None, None, None]
        ci = torch.arange(c, device=dev)[None, :, None, None]
        return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]

    def train_batch(self, idx: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """Gather train images ``idx`` (int64 ``[B]``), augment and normalize: float32 ``[B,3,H,W]``."""
        x = self.train_x[idx.to(self.train_x.device)]
        return self.normalize(self.augment(x, generator))


def _check_batch(x: torch.Tensor, arg: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.dim() != 4:
        got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) \
            else type(x).__name__
        raise FeddrKitError(f"{arg}: expected a uint8 tensor [B,3,H,W], got {got}")


def channel_stats(x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images ``[N,C,H,W]`` scaled to [0,1].

    Accumulates in float64 chunk by chunk; returns two float32 ``[C]`` tensors.
    """
    c = x.shape[1]
    total = torch.zeros(c, dtype=torch.float64)
    total_sq = torch.zeros(c, dtype=torch.float64)
    for start in range(0, x.shape[0], chunk):
        part = x[start:start + chunk].to(torch.float64).div_(255.0)
        total += part.sum(dim=(0, 2, 3)).cpu()
        total_sq += part.square_().sum(dim=(0, 2, 3)).cpu()
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    std = (total_sq / n - mean.square()).clamp_min(0).sqrt()
    return mean.float(), std.float()


def _make(name: str, train_x, train_y, test_x, test_y, classes, mean=None, std=None) -> ImageData:
    if mean is None or std is None:
        mean, std = channel_stats(train_x)
    return ImageData(name=name, train_x=train_x.contiguous(), train_y=train_y.long(),
                     test_x=test_x.contiguous(), test_y=test_y.long(),
                     classes=list(classes), mean=mean, std=std)


# --------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------

def load(name: str, root: str | Path | None = None, *, path: str | Path | None = None,
         download: bool = True, **kw) -> ImageData:
    """Load a dataset by name as an :class:`ImageData`.

    ``name``: ``"cifar10"``, ``"cifar100"`` (looked up in ``root``, else ``$FEDDR_DATA_DIR``,
    else the repo's ``data/``; downloaded there when absent and ``download`` is true),
    ``"imagefolder"`` (needs ``path=`` to a folder with ``train/<class>/*`` and
    ``test/<class>/*``) or ``"synthetic"`` (keywords ``num_classes``, ``train_per_class``,
    ``test_per_class``, ``image_size``, ``seed``). Raises :class:`FeddrKitError` on bad input.
    """
    if not isinstance(name, str) or name not in DATASETS:
        raise FeddrKitError(f"name: unknown dataset {name!r}; allowed: "
                            + ", ".join(repr(d) for d in DATASETS))
    if name != "synthetic" and kw:
        raise FeddrKitError(f"{sorted(kw)[0]}: load({name!r}) takes no such keyword; "
                            "allowed: root, path (imagefolder only), download")
    if name != "imagefolder" and path is not None:
        raise FeddrKitError(f"path: only used with name='imagefolder', not {name!r}; "
                            "use root= or FEDDR_DATA_DIR for the CIFAR data folder")
    if name == "synthetic":
        return synthetic(**kw)
    if name == "imagefolder":
        if path is None:
            raise FeddrKitError("path: load('imagefolder') needs path=<folder holding "
                                "train/<class>/* and test/<class>/*>")
        return load_imagefolder(path)
    return _load_cifar(name, root, download)


def data_dir(root: str | Path | None = None) -> Path:
    """Folder datasets live in: ``root``, else ``$FEDDR_DATA_DIR``, else the repo's ``data/``.

    A relative ``$FEDDR_DATA_DIR`` (CI uses ``../shared/data``) is taken from the current
    folder, or from the repo root when it only exists there (notebooks run in notebooks/).
    With neither set, a ``shared/data`` folder beside the repository is used when the repo's
    ``data/`` holds no dataset yet (an offline workplace's copy of CIFAR-10).
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("FEDDR_DATA_DIR")
    if not env:
        own, shared = REPO_ROOT / "data", REPO_ROOT.parent / "shared" / "data"
        known = [f for folders in _TORCHVISION.values() for f in folders[1:]]
        if shared.is_dir() and not any((own / f).exists() for f in known):
            return shared
        return own
    folder = Path(env).expanduser()
    if not folder.is_absolute() and not folder.exists() and (REPO_ROOT / folder).exists():
        return REPO_ROOT / folder
    return folder


def _load_cifar(name: str, root, download: bool) -> ImageData:
    cls_name, tv_folder, jpeg_folder = _TORCHVISION[name]
    folder = data_dir(root)
    if (folder / tv_folder).is_dir():
        try:
            return _load_torchvision(name, cls_name, folder, download=False)
        except RuntimeError:
            raise FeddrKitError(f"root: {folder / tv_folder} is incomplete or corrupted; delete "
                                "it and download again, or point root/FEDDR_DATA_DIR elsewhere"
                                ) from None
    if (folder / jpeg_folder).is_dir():
        return dataclasses.replace(load_imagefolder(folder / jpeg_folder), name=name)
    how = (f"set FEDDR_DATA_DIR (or root=) to a folder holding {tv_folder}/ or "
           f"{jpeg_folder}/")
    if not download:
        raise FeddrKitError(f"root: {name} not found in {folder} and download=False; "
                            f"{how}, or pass download=True while online")
    try:
        return _load_torchvision(name, cls_name, folder, download=True)
    except (OSError, RuntimeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FeddrKitError(f"root: {name} not found in {folder} and the download failed "
                            f"({reason}); {how}, or go online") from None


def _load_torchvision(name: str, cls_name: str, folder: Path, download: bool) -> ImageData:
    import torchvision

    dataset_cls = getattr(torchvision.datasets, cls_name)
    old_timeout = socket.getdefaulttimeout()
    made = None  # the outermost folder this call creates: removed again if the download fails
    if download:
        made = next((f for f in [*reversed(folder.parents), folder] if not f.exists()), None)
        folder.mkdir(parents=True, exist_ok=True)
        socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_S)
    try:
        splits = [dataset_cls(str(folder), train=t, download=download) for t in (True, False)]
    except BaseException:
        if made is not None:  # it holds only what this failed download put there
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        socket.setdefaulttimeout(old_timeout)
    xs = [torch.from_numpy(s.data).permute(0, 3, 1, 2).contiguous() for s in splits]
    ys = [torch.as_tensor(s.targets, dtype=torch.int64) for s in splits]
    return _make(name, xs[0], ys[0], xs[1], ys[1], splits[0].classes)


# --------------------------------------------------------------------------------------
# image folders and their cache
# --------------------------------------------------------------------------------------

def load_imagefolder(path: str | Path) -> ImageData:
    """Load a ``train/<class>/*`` + ``test/<class>/*`` image tree, decoding only on first use.

    Classes are the sorted class-folder names (as ``torchvision.datasets.ImageFolder``). The
    decoded tensors are cached in :func:`cache_dir`, keyed by the folder's resolved path and
    every file's (relative path, size, mtime), so editing the tree invalidates the cache. Writing a
    new cache file removes the stale ones of the same folder (each is as large as the dataset).
    """
    folder = _check_layout(path)
    listing = _list_files(folder)
    prefix = f"imagefolder-{_safe(folder.name)}-{_digest(str(folder))[:8]}-"
    cache_file = cache_dir() / f"{prefix}{_cache_key(listing)}.pt"
    cached = _read_cache(cache_file)
    if cached is None:
        cached = _decode_folder(folder)
        if _write_cache(cache_file, cached):
            for stale in cache_file.parent.glob(f"{prefix}*.pt"):
                if stale != cache_file:
                    stale.unlink(missing_ok=True)
    return _make(f"imagefolder:{folder.name}", cached["train_x"], cached["train_y"],
                 cached["test_x"], cached["test_y"], cached["classes"],
                 cached["mean"], cached["std"])


def cache_dir() -> Path:
    """Where decoded image folders are cached: ``$FEDDR_CACHE_DIR``, else the repo's
    ``data/cache`` if writable, else ``~/.cache/feddr_kit``. Created if missing."""
    env = os.environ.get("FEDDR_CACHE_DIR")
    candidates = [Path(env).expanduser()] if env else \
        [REPO_ROOT / "data" / "cache", Path.home() / ".cache" / "feddr_kit"]
    for cand in candidates:
        try:
            cand.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(cand, os.W_OK):
            return cand
    return candidates[-1]


def _hidden(entry_name: str) -> bool:
    return entry_name.startswith(".")


def _check_layout(path) -> Path:
    folder = Path(path).expanduser()
    if not folder.exists():
        raise FeddrKitError(f"path: folder {str(folder)!r} does not exist; expected a folder "
                            "with train/<class>/* and test/<class>/*")
    if not folder.is_dir():
        raise FeddrKitError(f"path: {str(folder)!r} is not a folder; expected a folder "
                            "with train/<class>/* and test/<class>/*")
    folder = folder.resolve()
    class_lists = {}
    for split in ("train", "test"):
        split_dir = folder / split
        if not split_dir.is_dir():
            raise FeddrKitError(f"path: {str(folder)!r} has no {split}/ folder; expected "
                                "train/<class>/* and test/<class>/*")
        entries = list(os.scandir(split_dir))
        # Like ImageFolder: every sub-folder is a class; stray hidden files are tolerated.
        loose = sorted(e.name for e in entries if not e.is_dir() and not _hidden(e.name))
        if loose:
            raise FeddrKitError(f"path: file {split}/{loose[0]} lies directly in {split}/; "
                                f"images must be inside class folders {split}/<class>/")
        class_lists[split] = sorted(e.name for e in entries if e.is_dir())
        if not class_lists[split]:
            raise FeddrKitError(f"path: {split}/ in {str(folder)!r} has no class folders; "
                                f"expected {split}/<class>/<image>")
    if class_lists["train"] != class_lists["test"]:
        only_train = sorted(set(class_lists["train"]) - set(class_lists["test"]))
        only_test = sorted(set(class_lists["test"]) - set(class_lists["train"]))
        raise FeddrKitError(f"path: train/ and test/ must have the same class folders; only in "
                            f"train: {only_train[:5]}, only in test: {only_test[:5]}")
    return folder


def _list_files(folder: Path) -> list[tuple[str, int, int]]:
    """Sorted (relative path, size, mtime_ns) of every file under train/ and test/."""
    out = []
    # (relative path, path) of each folder still to list: the relative path is built as the walk goes down,
    # since os.path.relpath on each of CIFAR-10's 60,000 files took most of a cached load's 2.4 s
    stack = [(split, os.path.join(folder, split)) for split in ("train", "test")]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                if e.is_dir():
                    stack.append((rel + os.sep + e.name, e.path))
                else:
                    st = e.stat()
                    out.append((rel + os.sep + e.name, st.st_size, st.st_mtime_ns))
    out.sort()
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _cache_key(listing: list[tuple[str, int, int]]) -> str:
    """Content key of an image tree: the cache format and every file's (relative path, size, mtime)."""
    return _digest(f"format={_CACHE_FORMAT}\n" + "\n".join(f"{p}\t{s}\t{m}" for p, s, m in listing))[:16]


def _safe(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in s)[:60]


def _read_cache(cache_file: Path) -> dict | None:
    if not cache_file.is_file():
        return None
    try:
        obj = torch.load(cache_file, map_location="cpu", weights_only=True)
        if obj.get("format") == _CACHE_FORMAT:
            return obj
    except Exception as err:  # a corrupt cache is never fatal: decode again
        warnings.warn(f"ignoring unreadable cache file {cache_file}: {err}", stacklevel=3)
    return None


def _write_cache(cache_file: Path, obj: dict) -> bool:
    """Write ``obj`` to ``cache_file`` atomically; True when written (a failure only warns)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=cache_file.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(torch_bytes(obj))  # plain I/O: a full disk is an OSError, never torch's writer failing
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; the cache is not secret
        os.replace(tmp, cache_file)  # atomic: readers see the old file or the whole new one
        return True
    except OSError as err:
        warnings.warn(f"could not write cache file {cache_file}: {err}", stacklevel=3)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return False


def _decode_folder(folder: Path) -> dict:
    from torchvision.datasets import ImageFolder

    samples, classes = {}, None
    for split in ("train", "test"):
        try:
            ds = ImageFolder(str(folder / split), loader=lambda p: p)
        except FileNotFoundError as err:
            raise FeddrKitError(f"path: {split}/ of {str(folder)!r}: {str(err).splitlines()[0]}"
                                ) from None
        samples[split], classes = ds.samples, ds.classes
    total = sum(len(s) for s in samples.values())
    out = {"format": _CACHE_FORMAT, "classes": classes}
    with progress.bar(total, f"decoding {folder.name} (once; cached after)", unit="images", leave=False) as bar:
        for split in ("train", "test"):
            out[f"{split}_x"] = _decode_images([p for p, _ in samples[split]], folder, bar)
            out[f"{split}_y"] = torch.tensor([y for _, y in samples[split]], dtype=torch.int64)
    if out["train_x"].shape[1:] != out["test_x"].shape[1:]:
        raise FeddrKitError(f"path: train images are {tuple(out['train_x'].shape[2:])} but test "
                            f"images are {tuple(out['test_x'].shape[2:])}; all must be one size")
    out["mean"], out["std"] = channel_stats(out["train_x"])
    return out


def _decode_images(paths: list[str], folder: Path, bar) -> torch.Tensor:
    """Decode image files into one uint8 ``[N,3,H,W]`` tensor; all images must be one size."""
    x = None
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its image decoders (one warning per call); they still
        # work and are ~2.5x faster than Pillow, which remains the fallback.
        warnings.simplefilter("ignore", DeprecationWarning)
        for i, p in enumerate(paths):
            img = _decode_one(p, folder)
            if x is None:
                x = torch.empty((len(paths), *img.shape), dtype=torch.uint8)
            elif img.shape != x.shape[1:]:
                raise FeddrKitError(f"path: image {os.path.relpath(p, folder)} is "
                                    f"{img.shape[1]}x{img.shape[2]} but the first is "
                                    f"{x.shape[2]}x{x.shape[3]}; all images must be one size")
            x[i] = img
            bar.update(1)
    return x


def _decode_one(p: str, folder: Path) -> torch.Tensor:
    """One image file as uint8 ``[3,H,W]`` (RGB): torchvision's decoder, else Pillow."""
    with open(p, "rb") as f:
        raw = f.read()
    try:
        from torchvision.io import ImageReadMode, decode_image

        return decode_image(torch.frombuffer(bytearray(raw), dtype=torch.uint8),
                            mode=ImageReadMode.RGB)
    except Exception:
        pass  # formats torchvision cannot decode (BMP, TIFF, ...), or no decoder: use Pillow
    try:
        import io

        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(raw)) as im:
            arr = np.array(im.convert("RGB"))
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    except Exception as err:
        raise FeddrKitError(f"path: cannot read image {os.path.relpath(p, folder)} "
                            f"({type(err).__name__}); every file in a class folder must be an "
                            "image") from None


# --------------------------------------------------------------------------------------
# synthetic
# --------------------------------------------------------------------------------------

def synthetic(num_classes: int = 10, train_per_class: int = 100, test_per_class: int = 20,
              image_size: int = 32, seed: int = 0, **unknown) -> ImageData:
    """Generate a small labelled image set offline (NOT real data; for smoke tests).

    Each class has its own colour and stripe orientation/frequency; images add a random
    phase and pixel noise. Returns ``ImageData`` with ``num_classes·train_per_class`` train
    and ``num_classes·test_per_class`` test images of shape ``[3,image_size,image_size]``.
    """
    if unknown:
        raise FeddrKitError(f"{sorted(unknown)[0]}: not a synthetic-data keyword; allowed: "
                            + ", ".join(_SYNTHETIC_DEFAULTS))
    for arg, value, low in (("num_classes", num_classes, 2), ("train_per_class", train_per_class, 1),
                            ("test_per_class", test_per_class, 1), ("image_size", image_size, 8),
                            ("seed", seed, 0)):
        if not _is_int(value) or value < low:
            raise FeddrKitError(f"{arg}: must be an integer >= {low}, got {value!r}")
    gen = torch.Generator().manual_seed(int(seed))
    colours = torch.rand(num_classes, 3, generator=gen) * 0.7 + 0.15
    train_x, train_y = _synthetic_split(colours, train_per_class, image_size, gen)
    test_x, test_y = _synthetic_split(colours, test_per_class, image_size, gen)
    classes = [f"class_{c}" for c in range(num_classes)]
    return _make("synthetic (NOT real data)", train_x, train_y, test_x, test_y, classes)


def _synthetic_split(colours: torch.Tensor, per_class: int, size: int,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    num_classes = colours.shape[0]
    y = torch.arange(num_classes).repeat_interleave(per_class)
    angle = math.pi * y.float() / num_classes                       # stripe orientation
    freq = 1.5 + (y % 3).float()                                    # stripes per image
    phase = torch.rand(len(y), generator=gen) * 2 * math.pi
    grid = torch.arange(size).float() / size
    proj = (grid[None, :, None] * torch.cos(angle)[:, None, None]
            + grid[None, None, :] * torch.sin(angle)[:, None, None])  # [N,H,W]
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])
    img = colours[y][:, :, None, None] * (0.55 + 0.45 * stripes[:, None])
    img = img + 0.08 * torch.randn(img.shape, generator=gen)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), y


def _is_int(v) -> bool:
    import numbers

    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
