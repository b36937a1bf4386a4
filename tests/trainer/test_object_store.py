"""Checkpoints in an S3-compatible object store: a real one (versitygw, tests/s3_server.py), the
real trainer with two processes writing to it and a second run resuming from it, the
guarantees that make the newest complete checkpoint win, and the store's errors as the
trainer's exit codes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_trainer import stores
from ddp_trainer.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
from ddp_trainer.contract import EXIT_CONFIG
from ddp_trainer.errors import StorageError, TemporaryError
from kube_ddp.local.plan import free_port
from tests.s3_server import S3Server, running_s3_server
from tests.trainer import support

NAME_OF_4 = "checkpoint-step-0000000004.pt"
TINY = ["--dataset=digits", "--model=mlp", "--batch-size=64", "--timeout-seconds=60"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3_server(tmp_path_factory.mktemp("s3") / "root") as server:
        yield server


@pytest.fixture
def uri(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's prefix, with this process's AWS environment pointing at the server."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3.create_bucket()}/jobs/run-1"


def _state(step: int) -> dict[str, Any]:
    return {"epoch": step, "model": {"w": torch.full((4,), float(step))}, "optimizer": {}}


def test_the_last_k_checkpoints_are_kept_in_the_bucket(uri: str, s3: S3Server) -> None:
    store = stores.open_store(uri)
    for step in range(1, 5):
        name = save_checkpoint(_state(step), store, step, keep=2)
    assert store.location(name) == f"{uri}/checkpoint-step-0000000004.pt"
    assert list_checkpoints(store) == ["checkpoint-step-0000000003.pt", NAME_OF_4]
    found = load_latest_checkpoint(store)
    assert found is not None
    assert found[0]["epoch"] == 4
    bucket = uri.removeprefix("s3://").split("/")[0]
    objects = s3.client().list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in objects) == [
        "jobs/run-1/checkpoint-step-0000000003.pt",
        f"jobs/run-1/{NAME_OF_4}",
    ]


def test_an_abandoned_multipart_upload_is_never_listed_or_read(uri: str, s3: S3Server) -> None:
    """A writer killed mid-upload leaves an incomplete multipart upload: the older checkpoint
    stays the newest complete one."""
    store = stores.open_store(uri)
    save_checkpoint(_state(1), store, 1, keep=3)
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    key = f"{prefix}/checkpoint-step-0000000002.pt"
    client = s3.client()
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    client.upload_part(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 5242880
    )
    assert client.list_multipart_uploads(Bucket=bucket)["Uploads"][0]["Key"] == key
    assert list_checkpoints(store) == ["checkpoint-step-0000000001.pt"]
    found = load_latest_checkpoint(store)
    assert found is not None
    assert found[0]["epoch"] == 1


def test_a_checkpoint_larger_than_a_part_goes_up_in_parts_and_reads_back_whole(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stores, "MULTIPART_CHUNK_BYTES", 5 * 1024 * 1024)
    big = {**_state(7), "model": {"w": torch.arange(3 * 1024 * 1024, dtype=torch.float32)}}
    store = stores.open_store(uri)
    save_checkpoint(big, store, 7, keep=1)
    found = load_latest_checkpoint(store)
    assert found is not None
    assert torch.equal(found[0]["model"]["w"], big["model"]["w"])


def test_a_truncated_object_is_skipped_for_the_older_one(
    uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = stores.open_store(uri)
    first = save_checkpoint(_state(1), store, 1, keep=3)
    store.write("checkpoint-step-0000000002.pt", store.read(first)[:100])
    with caplog.at_level(logging.WARNING):
        found = load_latest_checkpoint(store)
    assert found is not None
    assert found[0]["epoch"] == 1
    assert f"skipping unreadable checkpoint {uri}/checkpoint-step-0000000002.pt" in caplog.text


def test_a_wrong_secret_says_which_variable_to_check(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorageError, match=r"AWS_SECRET_ACCESS_KEY.*SignatureDoesNotMatch"):
        load_latest_checkpoint(stores.open_store(uri))


def test_a_missing_bucket_says_so(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StorageError, match=r"no such bucket.*NoSuchBucket"):
        save_checkpoint(_state(1), stores.open_store("s3://no-such-bucket/x"), 1, keep=1)


def test_an_unreachable_store_is_temporary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(TemporaryError, match=r"cannot reach s3://bucket/p.*after 2 attempts"):
        load_latest_checkpoint(stores.open_store("s3://bucket/p"))


@pytest.mark.parametrize("uri", ["s3://", "s3://Upper/x", "s3://ab"])
def test_a_malformed_uri_is_refused(uri: str) -> None:
    with pytest.raises(StorageError, match="not an S3 URI"):
        stores.open_store(uri)


def test_two_processes_checkpoint_to_the_store_and_a_second_run_resumes(
    s3: S3Server, tmp_path: Path
) -> None:
    uri = f"s3://{s3.create_bucket()}/digits"
    env = support.clean_env(
        **s3.env(),
        DDP_TRAINER_CRASH_ONCE_AT_EPOCH="2",
        DDP_TRAINER_CRASH_MARKER=str(tmp_path / "crashed"),
    )
    command = support.torchrun_command(
        *TINY, "--epochs=3", f"--checkpoint-dir={uri}", f"--summary-file={tmp_path / 's.json'}"
    )
    killed = support.run(command, env)
    assert killed.returncode != 0, killed.stderr  # rank 1 SIGKILLed after epoch 2's checkpoint
    assert [line["epoch"] for line in killed.epochs] == [1, 2]

    bucket = uri.removeprefix("s3://").split("/")[0]
    (second,) = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]][1:2]
    step = int(second.removeprefix("digits/checkpoint-step-").removesuffix(".pt"))
    resumed = support.run(command, env).check()
    assert f"resuming at step {step} (epoch 3, step 0 of it) from s3://{bucket}/{second}" in (
        resumed.stderr
    )
    assert [line["epoch"] for line in resumed.epochs] == [3]
    assert support.summary(tmp_path / "s.json")["resumed_from_epoch"] == 2
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert len(keys) == 3 and all(k.startswith("digits/checkpoint-step-") for k in keys), keys


def test_the_trainer_ends_on_a_wrong_secret_with_one_line_and_the_storage_code(
    s3: S3Server,
) -> None:
    uri = f"s3://{s3.create_bucket()}/x"
    run = support.run(
        support.trainer_command(*TINY, "--epochs=1", f"--checkpoint-dir={uri}"),
        support.clean_env(**s3.env(AWS_SECRET_ACCESS_KEY="wrong")),
    )
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("ddp-train: error:")]
    assert len(errors) == 1, run.stderr
    assert uri in errors[0] and "AWS_SECRET_ACCESS_KEY" in errors[0], errors[0]
