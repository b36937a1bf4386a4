"""Where checkpoints live: a directory or an S3-compatible object store, behind one interface.

A `Store` lists, writes, reads and deletes named entries; a write is atomic, so a reader sees a
whole entry or none:

- `DirectoryStore`: a temporary file, fsynced, renamed over the name, the directory fsynced
  (the rename survives a crash). A killed writer leaves a hidden temporary file, which is never
  listed and is removed by the next write.
- `ObjectStore` (`s3://bucket/prefix`): an object appears only when its single PUT, or its
  multipart upload's completion, succeeds; S3 never lists an upload that was not completed.
  A killed writer leaves at most an incomplete multipart upload: never listed, never read
  (the bucket's lifecycle rule `AbortIncompleteMultipartUpload` reclaims its space).
  Endpoint, region and credentials come from the standard AWS environment (`AWS_ENDPOINT_URL`,
  `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ..., or any source of boto3's
  credential chain).

Errors are the trainer's own (`ddp_trainer.errors`): a store that cannot be used as configured
(a wrong key, a missing bucket, a full disk) is a `StorageError`; a store that did not answer
after boto3's retries is a `TemporaryError`. A missing entry is `FileNotFoundError`.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ddp_trainer.contract import S3_SCHEME, S3_URI_PATTERN
from ddp_trainer.errors import StorageError, TemporaryError, storage, storage_error

# Objects larger than this go up in parts of this size (S3's minimum part is 5 MiB; one PUT
# holds at most 5 GiB).
MULTIPART_CHUNK_BYTES = 64 * 1024 * 1024
MAX_ATTEMPTS = 5  # boto3's standard retries, unless AWS_MAX_ATTEMPTS says otherwise
_TEMPORARY = re.compile(r"^\..+\.\d+\.tmp$")  # a DirectoryStore write in progress, or killed


class Store(Protocol):
    """Named entries in one place."""

    def names(self) -> list[str]:
        """Every entry's name (none that is being written)."""
        ...

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Store `data` under `name` atomically: a reader sees the old entry or the new one."""
        ...

    def read(self, name: str) -> bytes:
        """The entry's bytes; `FileNotFoundError` when there is none."""
        ...

    def delete(self, name: str) -> None:
        """Remove the entry; no error when it is gone already."""
        ...

    def location(self, name: str) -> str:
        """The entry, as a person would name it in a message."""
        ...


def open_store(location: str | os.PathLike[str]) -> Store:
    """The store a `--checkpoint-dir` names: `s3://bucket/prefix`, else a directory."""
    text = os.fspath(location)
    if text.startswith(S3_SCHEME):
        return ObjectStore.from_uri(text)
    return DirectoryStore(Path(text))


@dataclass(frozen=True)
class DirectoryStore:
    directory: Path

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        with storage(self.directory, "cannot list"):
            return [p.name for p in self.directory.iterdir() if not _TEMPORARY.match(p.name)]

    def write(self, name: str, data: bytes | memoryview) -> None:
        final = self.directory / name
        temporary = self.directory / f".{name}.{os.getpid()}.tmp"
        with storage(final, "cannot write"):
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                with temporary.open("wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, final)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            _fsync_directory(self.directory)
            for leftover in self.directory.iterdir():  # from writers killed mid-write
                if _TEMPORARY.match(leftover.name) and leftover != temporary:
                    leftover.unlink(missing_ok=True)

    def read(self, name: str) -> bytes:
        path = self.directory / name
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise storage_error(exc, "cannot read") from None

    def delete(self, name: str) -> None:
        with storage(self.directory / name, "cannot remove"):
            (self.directory / name).unlink(missing_ok=True)

    def location(self, name: str) -> str:
        return str(self.directory / name)


# S3's error codes that retrying cannot fix, each with what to change.
_S3_FIXES = {
    "InvalidAccessKeyId": "the access key is not known to the store: check AWS_ACCESS_KEY_ID "
    "(the Secret the job's checkpointStore.secretName names)",
    "SignatureDoesNotMatch": "the secret key does not match the access key: check "
    "AWS_SECRET_ACCESS_KEY (the Secret the job's checkpointStore.secretName names)",
    "AccessDenied": "access denied: give the credentials' user list, read, write and delete "
    "rights on the bucket and prefix",
    "NoSuchBucket": "no such bucket: create it, or check the bucket in the checkpoint URI",
    "InvalidBucketName": "not a valid bucket name: check the bucket in the checkpoint URI",
    "PermanentRedirect": "the bucket is in another region: set AWS_REGION to its region",
    "AuthorizationHeaderMalformed": "the request names the wrong region: set AWS_REGION to "
    "the bucket's region",
    "ExpiredToken": "the session token has expired: renew AWS_SESSION_TOKEN",
    "InvalidToken": "the session token is not valid: check AWS_SESSION_TOKEN",
}


@dataclass
class ObjectStore:
    """Entries are the objects `<prefix>/<name>` of one bucket."""

    bucket: str
    prefix: str  # without slashes at either end; "" for the bucket's top level
    _client: Any = field(default=None, init=False, repr=False)

    @classmethod
    def from_uri(cls, uri: str) -> ObjectStore:
        if not re.match(S3_URI_PATTERN, uri):
            raise StorageError(
                f"{uri} is not an S3 URI: write s3://BUCKET or s3://BUCKET/PREFIX, with a "
                "bucket name of 3-63 lowercase letters, digits, dots and hyphens"
            )
        bucket, _, prefix = uri.removeprefix(S3_SCHEME).partition("/")
        return cls(bucket, prefix.strip("/"))

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3  # here: a trainer that checkpoints to a directory never pays for it
            from botocore.config import Config

            retries: dict[str, Any] = {"mode": os.environ.get("AWS_RETRY_MODE", "standard")}
            if "AWS_MAX_ATTEMPTS" not in os.environ:
                retries["max_attempts"] = MAX_ATTEMPTS
            # S3-compatible servers at an endpoint of their own answer at the path of the
            # bucket; their host names have no bucket subdomains.
            custom = any(os.environ.get(v) for v in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"))
            config = Config(
                retries=retries,
                s3={"addressing_style": "path" if custom else "auto"},
                connect_timeout=10,
                read_timeout=60,
            )
            with self._errors(self.location("")):
                self._client = boto3.session.Session().client("s3", config=config)
        return self._client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def names(self) -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        found = []
        with self._errors(self.location("")):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start, Delimiter="/"
            )
            for page in pages:
                found += [entry["Key"][len(start) :] for entry in page.get("Contents", [])]
        return found

    def write(self, name: str, data: bytes | memoryview) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_CHUNK_BYTES, multipart_chunksize=MULTIPART_CHUNK_BYTES
        )
        # boto3 aborts a multipart upload that fails; one whose process is killed stays
        # incomplete, and S3 lists only completed objects.
        with self._errors(self.location(name)):
            self.client.upload_fileobj(
                io.BytesIO(data), self.bucket, self._key(name), Config=config
            )

    def read(self, name: str) -> bytes:
        with self._errors(self.location(name)):
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            return bytes(answer["Body"].read())

    def delete(self, name: str) -> None:
        with self._errors(self.location(name)):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def location(self, name: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self._key(name)}".rstrip("/")

    @contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        """botocore's errors as the trainer's: what to change, or retry later."""
        from boto3.exceptions import S3UploadFailedError
        from botocore import exceptions as aws

        try:
            yield
        except aws.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "NoSuchKey":
                raise FileNotFoundError(where) from None
            raise _client_error(where, code, str(error.get("Message", exc))) from None
        except S3UploadFailedError as exc:  # boto3's transfer wraps the ClientError's text
            text = str(exc)
            code = next((c for c in _S3_FIXES if f"({c})" in text), "")
            raise _client_error(where, code, text) from None
        except (aws.NoCredentialsError, aws.PartialCredentialsError) as exc:
            raise StorageError(
                f"cannot use {where}: {exc}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(a job names the Secret that holds them in checkpointStore.secretName)"
            ) from None
        except (aws.NoRegionError, aws.InvalidEndpointConfigurationError, ValueError) as exc:
            raise StorageError(f"cannot use {where}: {exc}") from None
        except (aws.EndpointConnectionError, aws.ConnectionError, aws.HTTPClientError) as exc:
            raise TemporaryError(
                f"cannot reach {where}: {exc} (after {self._attempts()} attempts)"
            ) from None

    def _attempts(self) -> str:
        return os.environ.get("AWS_MAX_ATTEMPTS", str(MAX_ATTEMPTS))


def _client_error(where: str, code: str, message: str) -> StorageError | TemporaryError:
    fix = _S3_FIXES.get(code)
    if fix:
        return StorageError(f"cannot use {where}: {fix} ({code})")
    # Anything else the store answered after boto3's retries (503 SlowDown, 500 InternalError,
    # a throttle): it may pass, so the group restarts.
    return TemporaryError(f"cannot use {where}: {message} ({code or 'no error code'})")


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
