"""The datasets as numpy arrays, read from their published formats without torchvision.

mnist and fashion-mnist are IDX files (gzipped or not), cifar10 the python pickle batches,
digits comes with scikit-learn, synthetic is generated. Files are looked up in --data-dir, in
--data-dir/<dataset>, and in torchvision's layout, so an existing download can be mounted as is.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import shutil
import tarfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from ddp_trainer.errors import StorageError, TemporaryError, TrainerError, storage
from ddp_trainer.options import TrainerOptions


@dataclass(frozen=True)
class Splits:
    """A dataset: images as (N, C, H, W) (or (N, D) when flat), labels as int64."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    num_classes: int

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def load_dataset(options: TrainerOptions) -> Splits:
    """The dataset named by the options (files must be present: see `download_dataset`)."""
    data_dir = Path(options.data_dir)
    if options.dataset in IDX_SOURCES:
        return _load_idx_dataset(options.dataset, data_dir)
    if options.dataset == "cifar10":
        return _load_cifar10(data_dir)
    if options.dataset == "digits":
        return _load_digits(options.val_fraction, options.seed)
    return make_synthetic(
        samples=options.synthetic_samples,
        shape=tuple(int(size) for size in options.synthetic_shape.split("x")),
        num_classes=options.num_classes,
        val_fraction=options.val_fraction,
        seed=options.seed,
    )


# --- MNIST and Fashion-MNIST: IDX ------------------------------------------------------------

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "val_x": "t10k-images-idx3-ubyte",
    "val_y": "t10k-labels-idx1-ubyte",
}
_TORCHVISION_DIRS = {"mnist": "MNIST/raw", "fashion-mnist": "FashionMNIST/raw"}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not): big-endian magic 0 0 <type> <ndim>, the sizes, the data."""
    with storage(path, "cannot read"):
        raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_DTYPES:
        raise TrainerError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(size) for size in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise TrainerError(
            f"{path} is truncated or padded: header says {shape}, "
            f"{expected} data bytes, found {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(shape)


def _load_idx_dataset(name: str, data_dir: Path) -> Splits:
    arrays = {
        key: read_idx(_find_idx_file(name, data_dir, base)) for key, base in IDX_FILES.items()
    }
    for split in ("train", "val"):
        images, labels = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise TrainerError(
                f"{name}: {split} images {images.shape} and labels {labels.shape} do not match"
            )
    return Splits(
        train_x=arrays["train_x"][:, None],  # one channel
        train_y=arrays["train_y"].astype(np.int64),
        val_x=arrays["val_x"][:, None],
        val_y=arrays["val_y"].astype(np.int64),
        num_classes=10,
    )


def _dataset_dirs(name: str, data_dir: Path) -> list[Path]:
    dirs = [data_dir, data_dir / name]
    if name in _TORCHVISION_DIRS:
        dirs.append(data_dir / _TORCHVISION_DIRS[name])
    return dirs


def _find_idx_file(name: str, data_dir: Path, base: str) -> Path:
    for directory in _dataset_dirs(name, data_dir):
        for candidate in (directory / base, directory / f"{base}.gz"):
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(d) for d in _dataset_dirs(name, data_dir))
    raise StorageError(
        f"{name}: {base}[.gz] not found (looked in {looked}); "
        "mount the dataset there or pass --download"
    )


# --- CIFAR-10: python pickle batches -------------------------------------------------------

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"


def _find_cifar_dir(data_dir: Path) -> Path:
    candidates = [data_dir / CIFAR_DIR, data_dir / "cifar10" / CIFAR_DIR, data_dir]
    for directory in candidates:
        if (directory / CIFAR_TEST_BATCH).is_file():
            return directory
    looked = ", ".join(str(d) for d in candidates)
    raise StorageError(
        f"cifar10: {CIFAR_TEST_BATCH} not found (looked in {looked}); "
        "mount the python version of CIFAR-10 there or pass --download"
    )


# What a CIFAR batch's pickle may name: numpy arrays (as Python 2's numpy wrote them, and as
# numpy 2 does) and nothing else. A shared dataset volume is written by others; its files are
# data, never code (`pickle.load` would run any callable a file names).
CIFAR_PICKLE_NAMES: Final = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.numeric", "_frombuffer"),
        ("builtins", "bytearray"),
        ("_codecs", "encode"),  # bytes in a protocol-2 pickle that Python 3 wrote
    }
)


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core."):  # numpy 1's path, numpy 2's `numpy._core`
            module = "numpy._core." + module.removeprefix("numpy.core.")
        if (module, name) not in CIFAR_PICKLE_NAMES:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR batch holds")
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled CIFAR batch: 10000x3072 uint8 rows (R, G, B planes of 32x32) and labels,
    read by an unpickler that builds numpy arrays and plain values only."""
    try:
        with path.open("rb") as file:
            batch = _CifarUnpickler(file, encoding="bytes").load()
        data, labels = batch[b"data"], batch[b"labels"]
    except FileNotFoundError:
        raise TrainerError(f"cifar10: {path} not found") from None
    except Exception as exc:
        raise TrainerError(f"cifar10: {path} is not a CIFAR python batch ({exc})") from None
    images = np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels_array = np.asarray(labels, dtype=np.int64)
    if len(images) != len(labels_array):
        raise TrainerError(f"cifar10: {path} has {len(images)} images, {len(labels_array)} labels")
    return images, labels_array


def _load_cifar10(data_dir: Path) -> Splits:
    directory = _find_cifar_dir(data_dir)
    train = [read_cifar_batch(directory / name) for name in CIFAR_TRAIN_BATCHES]
    val_x, val_y = read_cifar_batch(directory / CIFAR_TEST_BATCH)
    return Splits(
        train_x=np.concatenate([images for images, _ in train]),
        train_y=np.concatenate([labels for _, labels in train]),
        val_x=val_x,
        val_y=val_y,
        num_classes=10,
    )


# --- digits and synthetic -------------------------------------------------------------------


def _split(x: np.ndarray, y: np.ndarray, val_fraction: float, seed: int, classes: int) -> Splits:
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = max(1, round(len(x) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return Splits(x[train], y[train], x[val], y[val], num_classes=classes)


def _load_digits(val_fraction: float, seed: int) -> Splits:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise TrainerError("--dataset digits needs scikit-learn (ddp-trainer[digits])") from None
    digits = load_digits()
    images = (digits.images * (255 / 16)).astype(np.uint8)[:, None]  # 0..16 -> a 0..255 image
    return _split(images, digits.target.astype(np.int64), val_fraction, seed, classes=10)


def make_synthetic(
    samples: int, shape: tuple[int, ...], num_classes: int, val_fraction: float, seed: int
) -> Splits:
    """A learnable problem: each class is a fixed random pattern, each sample one plus noise.

    The noise is strong enough that no single sample shows its class plainly, so accuracy
    grows over the first epochs rather than being perfect at once.
    """
    rng = np.random.default_rng(seed)
    dims = int(np.prod(shape))
    patterns = rng.standard_normal((num_classes, dims), dtype=np.float32)
    labels = rng.integers(0, num_classes, samples)
    noise = rng.standard_normal((samples, dims), dtype=np.float32)
    signal = 4.0 / np.sqrt(dims)  # class patterns a fixed distance apart whatever the size
    images = (patterns[labels] * signal + noise).reshape(samples, *shape)
    return _split(images, labels.astype(np.int64), val_fraction, seed, num_classes)


# --- download -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remote:
    """A published file: where it may be fetched from and its published MD5."""

    name: str
    md5: str
    mirrors: tuple[str, ...]


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
_FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)

IDX_SOURCES: dict[str, tuple[Remote, ...]] = {
    "mnist": (
        Remote("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873", _MNIST_MIRRORS),
        Remote("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432", _MNIST_MIRRORS),
        Remote("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3", _MNIST_MIRRORS),
        Remote("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c", _MNIST_MIRRORS),
    ),
    "fashion-mnist": (
        Remote("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", _FASHION_MIRRORS),
        Remote("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", _FASHION_MIRRORS),
        Remote("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79", _FASHION_MIRRORS),
        Remote("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310", _FASHION_MIRRORS),
    ),
}
CIFAR10_ARCHIVE = Remote(
    "cifar-10-python.tar.gz",
    "c58f30108f718f92721af3b95e74349a",
    ("https://www.cs.toronto.edu/~kriz/",),
)


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)  # the published sums are MD5: integrity only
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_verified(remote: Remote, directory: Path, log: Callable[[str], None] = print) -> Path:
    """`directory/remote.name`, downloaded from the first mirror that serves the right bytes.

    A file already there with the right checksum is kept. The download goes to a temporary
    file that is renamed only once its checksum matches, so a reader never sees a partial file.
    """
    target = directory / remote.name
    if target.is_file() and md5_of(target) == remote.md5:
        return target
    partial = target.with_name(target.name + ".part")
    failures = []
    for mirror in remote.mirrors:
        url = mirror + remote.name
        log(f"downloading {url}")
        with storage(partial, "cannot write the download to"):
            directory.mkdir(parents=True, exist_ok=True)
            out = partial.open("wb")
        with out:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    while block := response.read(1 << 20):
                        # a StorageError, which is no OSError: not taken for the network's
                        with storage(partial, "cannot write the download to"):
                            out.write(block)
            except OSError as exc:  # urllib's errors and reads: the mirror's side
                failures.append(f"{url}: {exc}")
                continue
        actual = md5_of(partial)
        if actual == remote.md5:
            with storage(target, "cannot write the download to"):
                partial.replace(target)
            return target
        failures.append(f"{url}: md5 {actual}, expected {remote.md5}")
    partial.unlink(missing_ok=True)
    raise TemporaryError(
        f"could not download {remote.name} into {directory}: "
        + "; ".join(failures)
        + " (the job is retried; or put the files there yourself and drop download)"
    )


def download_dataset(options: TrainerOptions, log: Callable[[str], None] = print) -> None:
    """Fetch and verify the dataset's files into --data-dir/<dataset> (mnist, fashion, cifar10)."""
    directory = Path(options.data_dir) / options.dataset
    if options.dataset in IDX_SOURCES:
        for remote in IDX_SOURCES[options.dataset]:
            fetch_verified(remote, directory, log)
    elif options.dataset == "cifar10":
        if (directory / CIFAR_DIR / CIFAR_TEST_BATCH).is_file():
            return
        archive = fetch_verified(CIFAR10_ARCHIVE, directory, log)
        # Unpack beside, then rename: a killed extraction never looks like a complete one.
        unpacking = directory / ".unpacking"
        with storage(unpacking, "cannot unpack CIFAR-10 into"):
            shutil.rmtree(unpacking, ignore_errors=True)
            with tarfile.open(archive) as tar:
                tar.extractall(unpacking, filter="data")  # no paths outside `unpacking`
            shutil.rmtree(directory / CIFAR_DIR, ignore_errors=True)
            (unpacking / CIFAR_DIR).replace(directory / CIFAR_DIR)
            shutil.rmtree(unpacking)
