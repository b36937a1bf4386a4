"""Dataset formats, checksum-verified downloads, and each rank's share of an epoch."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_trainer.batches import Normalizer, augment, eval_shard, make_batches, train_shard
from ddp_trainer.datasets import (
    CIFAR10_ARCHIVE,
    IDX_SOURCES,
    Remote,
    fetch_verified,
    load_dataset,
    make_synthetic,
    read_cifar_batch,
    read_idx,
)
from ddp_trainer.errors import TrainerError
from ddp_trainer.options import TrainerOptions
from tests.trainer import support

# --- formats -----------------------------------------------------------------------------


def test_idx_files_read_the_same_gzipped_or_not(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "plain").write_bytes(support.idx_bytes(array))
    (tmp_path / "packed.gz").write_bytes(gzip.compress(support.idx_bytes(array)))
    np.testing.assert_array_equal(read_idx(tmp_path / "plain"), array)
    np.testing.assert_array_equal(read_idx(tmp_path / "packed.gz"), array)


def test_idx_reader_rejects_bad_magic_and_truncation(tmp_path: Path) -> None:
    data = support.idx_bytes(np.zeros((4, 5), np.uint8))
    (tmp_path / "bad").write_bytes(b"\x01" + data[1:])
    (tmp_path / "short").write_bytes(data[:-3])
    with pytest.raises(TrainerError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    with pytest.raises(TrainerError, match="truncated"):
        read_idx(tmp_path / "short")


@pytest.mark.parametrize("layout", [".", "mnist", "MNIST/raw"])
def test_mnist_is_found_in_the_usual_layouts(tmp_path: Path, layout: str) -> None:
    support.write_idx_dataset(tmp_path / layout, train=30, test=10, gz=layout != "mnist")
    splits = load_dataset(TrainerOptions(dataset="mnist", data_dir=str(tmp_path)))
    assert splits.train_x.shape == (30, 1, 28, 28)
    assert splits.val_x.shape == (10, 1, 28, 28)
    assert splits.train_y.dtype == np.int64
    assert splits.num_classes == 10


def test_missing_idx_files_name_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(
        TrainerError, match=r"train-images-idx3-ubyte\[\.gz\] not found.*--download"
    ):
        load_dataset(TrainerOptions(dataset="fashion-mnist", data_dir=str(tmp_path)))


def test_cifar_python_batches(tmp_path: Path) -> None:
    support.write_cifar_dataset(tmp_path, per_batch=20, test=10)
    splits = load_dataset(TrainerOptions(dataset="cifar10", data_dir=str(tmp_path)))
    assert splits.train_x.shape == (100, 3, 32, 32)
    assert splits.val_x.shape == (10, 3, 32, 32)
    # Rows are R, G, B planes: reshaping to NCHW must give back the images written.
    images, labels = support.striped_images(10, 99)
    np.testing.assert_array_equal(splits.val_x, images)
    np.testing.assert_array_equal(splits.val_y, labels)


def test_a_file_that_is_not_a_cifar_batch_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(TrainerError, match="not a CIFAR python batch"):
        read_cifar_batch(tmp_path / "test_batch")


def test_digits_and_synthetic_split_by_val_fraction() -> None:
    digits = load_dataset(TrainerOptions(dataset="digits", val_fraction=0.25))
    assert len(digits.train_y) + len(digits.val_y) == 1797
    assert len(digits.val_y) == round(1797 * 0.25)
    assert digits.train_x.shape[1:] == (1, 8, 8)
    synthetic = make_synthetic(1000, (3, 8, 8), 5, 0.2, seed=7)
    assert synthetic.train_x.shape == (800, 3, 8, 8)
    assert synthetic.num_classes == 5
    again = make_synthetic(1000, (3, 8, 8), 5, 0.2, seed=7)
    np.testing.assert_array_equal(synthetic.train_x, again.train_x)  # same on every rank


# --- download: the verification logic, against a local mirror -----------------------------


def _mirror(tmp_path: Path, name: str, content: bytes) -> tuple[str, str]:
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / name).write_bytes(content)
    return mirror.as_uri() + "/", hashlib.md5(content).hexdigest()


def test_fetch_keeps_a_file_whose_checksum_matches(tmp_path: Path) -> None:
    url, md5 = _mirror(tmp_path, "data.gz", b"payload")
    target = fetch_verified(Remote("data.gz", md5, (url,)), tmp_path / "out", log=lambda _: None)
    assert target.read_bytes() == b"payload"
    assert sorted(p.name for p in target.parent.iterdir()) == ["data.gz"]


def test_fetch_refuses_a_corrupt_download_and_leaves_nothing(tmp_path: Path) -> None:
    url, _ = _mirror(tmp_path, "data.gz", b"tampered")
    remote = Remote("data.gz", hashlib.md5(b"payload").hexdigest(), (url,))
    with pytest.raises(TrainerError, match=r"data\.gz.*md5"):
        fetch_verified(remote, tmp_path / "out", log=lambda _: None)
    assert list((tmp_path / "out").iterdir()) == []


def test_fetch_falls_back_to_the_next_mirror(tmp_path: Path) -> None:
    url, md5 = _mirror(tmp_path, "data.gz", b"payload")
    dead = (tmp_path / "nowhere").as_uri() + "/"
    target = fetch_verified(Remote("data.gz", md5, (dead, url)), tmp_path / "out", lambda _: None)
    assert target.read_bytes() == b"payload"


def test_fetch_skips_a_verified_file_already_there(tmp_path: Path) -> None:
    (tmp_path / "data.gz").write_bytes(b"payload")
    dead = (tmp_path / "nowhere").as_uri() + "/"
    remote = Remote("data.gz", hashlib.md5(b"payload").hexdigest(), (dead,))
    assert fetch_verified(remote, tmp_path, log=lambda _: None) == tmp_path / "data.gz"


def test_published_checksums_are_well_formed() -> None:
    remotes = [*IDX_SOURCES["mnist"], *IDX_SOURCES["fashion-mnist"], CIFAR10_ARCHIVE]
    for remote in remotes:
        assert len(remote.md5) == 32
        assert int(remote.md5, 16) >= 0
        assert all(mirror.startswith(("https://", "http://")) for mirror in remote.mirrors)


# --- sharding -------------------------------------------------------------------------------


@pytest.mark.parametrize(("samples", "world"), [(10, 3), (12, 4), (7, 1), (2, 3)])
def test_training_shards_are_distributed_sampler_shards(samples: int, world: int) -> None:
    for epoch in (0, 1, 5):
        for rank in range(world):
            sampler = DistributedSampler(
                range(samples), num_replicas=world, rank=rank, shuffle=True, seed=3
            )
            sampler.set_epoch(epoch)
            assert train_shard(samples, rank, world, epoch, seed=3).tolist() == list(sampler)


def test_training_shards_cover_the_data_evenly_and_reshuffle_each_epoch() -> None:
    shards = [train_shard(10, rank, 3, epoch=1, seed=0) for rank in range(3)]
    assert {len(shard) for shard in shards} == {4}  # padded: every rank takes 4 steps' worth
    assert set(torch.cat(shards).tolist()) == set(range(10))
    assert not torch.equal(train_shard(10, 0, 3, 1, 0), train_shard(10, 0, 3, 2, 0))


@pytest.mark.parametrize(("before", "after"), [(3, 3), (3, 2), (2, 3)])
def test_an_epoch_resumed_at_another_world_size_trains_each_sample_once(
    before: int, after: int
) -> None:
    """Two steps of batch 4 at world size `before`, then the rest of the epoch at `after`:
    together every sample of the epoch once (and a few again only as padding); at the same
    world size, exactly the batches an uninterrupted epoch would take."""
    samples, batch, steps = 50, 4, 2
    trained = torch.cat(
        [train_shard(samples, r, before, 1, 0)[: steps * batch] for r in range(before)]
    )
    skip = steps * batch * before
    rest = [train_shard(samples, r, after, 1, 0, skip=skip) for r in range(after)]
    together = trained.tolist() + torch.cat(rest).tolist()
    padding = len(torch.cat(rest)) - (samples - skip)  # to even out the ranks' steps
    assert sorted(set(together)) == list(range(samples))
    assert len(together) == samples + padding and padding < after
    if before == after:
        whole = [train_shard(samples, r, after, 1, 0)[steps * batch :] for r in range(after)]
        assert all(torch.equal(a, b) for a, b in zip(rest, whole, strict=True))


def test_evaluation_shards_count_every_sample_once() -> None:
    shards = [eval_shard(10, rank, 3).tolist() for rank in range(3)]
    assert sorted(index for shard in shards for index in shard) == list(range(10))
    assert [len(shard) for shard in shards] == [4, 3, 3]


def test_augmentation_shifts_and_flips_whole_images() -> None:
    images = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).reshape(2, 3, 6, 6)
    out = augment(images, flip=True, generator=torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    for original, moved in zip(images, out, strict=True):
        kept = set(moved.flatten().tolist()) - {0.0}
        assert kept <= set(original.flatten().tolist())  # pixels move; none are invented
        assert len(kept) >= 3 * 4 * 4 - 1  # at most 2 rows and 2 columns shifted out


# --- the DataLoader path's memory -------------------------------------------------------------


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except OSError:  # gone meanwhile
            continue
        if parent == pid:
            children.append(int(stat.parent.name))
    return children


def _private_bytes(pid: int) -> int:
    """Memory only this process maps (USS): a copy of its own, not pages it shares."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return sum(
        int(line.split()[1]) * 1024
        for line in rollup.splitlines()
        if line.startswith(("Private_Clean:", "Private_Dirty:"))
    )


def test_loader_workers_share_the_split_instead_of_copying_it() -> None:
    """Data over the device budget goes through a DataLoader whose forkserver workers are
    each sent the dataset: in shared memory, a worker maps the rank's one copy of the split;
    pickled as an array, each would hold a copy of its own (16 for 8 ranks x 2 workers)."""
    small = _workers_private_bytes(np.zeros((64, 3, 128, 128), dtype=np.uint8))
    images = np.random.default_rng(0).integers(0, 255, (4096, 3, 128, 128), dtype=np.uint8)
    large = _workers_private_bytes(images)  # a split of 192 MiB
    for own_small, own_large in zip(small, large, strict=True):
        assert own_large - own_small < images.nbytes / 4, (small, large, images.nbytes)


def _workers_private_bytes(images: np.ndarray) -> list[int]:
    """Each loader worker's own memory once it has served an epoch of `images`."""
    before = set(_children(_forkserver()) if _forkserver() else ())
    labels = np.zeros(len(images), dtype=np.int64)
    options = TrainerOptions(loader="dataloader", num_workers=2)
    cpu = torch.device("cpu")
    batches = make_batches(images, labels, Normalizer(images[:64], cpu), cpu, 64, options)
    for _ in batches(torch.arange(len(images))):  # every worker reads its share of the split
        pass
    server = _forkserver()
    assert server is not None
    workers = sorted(set(_children(server)) - before)
    assert len(workers) == 2, workers
    return [_private_bytes(pid) for pid in workers]


def _forkserver() -> int | None:
    servers = [pid for pid in _children(os.getpid()) if "forkserver" in _cmdline(pid)]
    return servers[0] if servers else None


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


class _Planted:
    """A pickle that runs a command when loaded, as a writer of a shared volume could plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_in_the_dataset_runs_nothing(tmp_path: Path) -> None:
    """An extracted CIFAR-10 folder on a shared volume is anyone's to write: a batch that names
    a callable is refused, saying which, and the callable never runs."""
    support.write_cifar_dataset(tmp_path, per_batch=4, test=4)
    marker = tmp_path / "ran"
    batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(pickle.dumps({b"data": _Planted(marker), b"labels": []}))
    with pytest.raises(TrainerError, match=r"not a CIFAR python batch \(it names posix.system"):
        load_dataset(TrainerOptions(dataset="cifar10", data_dir=str(tmp_path)))
    assert not marker.exists()


@pytest.mark.parametrize(
    ("protocol", "numpy_1"),
    [(2, True), (2, False), (pickle.HIGHEST_PROTOCOL, False)],
    ids=["as published (Python 2, numpy.core)", "protocol 2, numpy 2", "protocol 5, numpy 2"],
)
def test_cifar_batches_as_python_2_and_numpy_2_wrote_them_load(
    tmp_path: Path, protocol: int, numpy_1: bool
) -> None:
    """The published batches are Python 2 pickles (protocol 2, numpy.core's names); a batch
    written today is protocol 5 with numpy._core's."""
    images, labels = support.striped_images(6, 3)
    batch = {
        b"batch_label": b"x",
        b"labels": [int(v) for v in labels],
        b"data": images.reshape(6, -1),
    }
    written = pickle.dumps(batch, protocol=protocol)
    if numpy_1:  # protocol 2 names a global as text: numpy 1 wrote numpy.core
        assert b"numpy._core.multiarray" in written
        written = written.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path = tmp_path / "test_batch"
    path.write_bytes(written)
    got_images, got_labels = read_cifar_batch(path)
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
