"""TensorBoard event files, rank 0's: torch's `SummaryWriter` into a directory, or into a local
directory whose files are copied to an object store (`s3://bucket/prefix`).

The copy goes through `ddp_trainer.stores`, the checkpoints' own: the same AWS environment,
path-style addressing for a store of one's own, retries and errors. TensorBoard's S3 reader
(`tensorboard --logdir s3://...`, boto3 installed, `S3_ENDPOINT` for a store of one's own)
reads the objects as it reads a directory. Each process writes an event file of its own (its
name carries the time, host and pid), re-uploaded whole when it grew: a file holds a few
bytes per scalar, so a long run's stays in the megabytes.

`purge_step`: the first step this process logs. The writer starts its file with a SessionLog
START at that step, and TensorBoard then hides every event of earlier files at that step or
later: what a process logged after the checkpoint it crashed from is trained, and logged,
again by the one that resumes, as one line.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ddp_trainer import stores
from ddp_trainer.contract import S3_SCHEME
from ddp_trainer.errors import StorageError, TemporaryError

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30  # the writer's own flush; as often as a heartbeat
UPLOAD_SECONDS = 30.0  # an object store's copy is at most this much behind


class EventFiles:
    """Scalars by step into event files at `log_dir` (a directory or `s3://...`)."""

    def __init__(self, log_dir: str, purge_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # here: tensorboard is optional

        self.store = stores.open_store(log_dir) if log_dir.startswith(S3_SCHEME) else None
        self.local = Path(tempfile.mkdtemp(prefix="ddp-trainer-events-")) if self.store else None
        self.writer = SummaryWriter(
            log_dir=str(self.local or log_dir), purge_step=purge_step, flush_secs=FLUSH_SECONDS
        )
        self.uploaded: dict[str, int] = {}  # file name -> the size last copied
        self.uploaded_at = -math.inf
        self._upload: threading.Thread | None = None

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def flush(self, wait: bool = False) -> None:
        """To the files now; to the store when a copy is due (`wait`: now, and done)."""
        self.writer.flush()
        if self.store is None:
            return
        if self._upload is not None and self._upload.is_alive():
            if not wait:
                return  # one copy in flight: the next flush takes what this one missed
            self._upload.join()
        if wait:
            self._copy()
        elif time.monotonic() - self.uploaded_at >= UPLOAD_SECONDS:
            self._upload = threading.Thread(target=self._copy, name="event-upload", daemon=True)
            self._upload.start()

    def close(self, outcome: str = "", checkpoint: str | None = None) -> None:
        """The last events, written and copied; `outcome` and `checkpoint` are MLflow's."""
        if self._upload is not None:
            self._upload.join()
        self.writer.close()
        if self.local is not None:
            self._copy()  # close wrote the last events
            shutil.rmtree(self.local, ignore_errors=True)

    def _copy(self) -> None:
        """Every file that grew since its last copy, whole (an object is written at once)."""
        assert self.store is not None and self.local is not None
        self.uploaded_at = time.monotonic()
        for path in sorted(self.local.iterdir()):
            size = path.stat().st_size
            if self.uploaded.get(path.name) == size:
                continue
            try:
                self.store.write(path.name, path.read_bytes())
            except (StorageError, TemporaryError) as exc:
                log.warning("could not copy TensorBoard events: %s", exc)
                return
            self.uploaded[path.name] = size
