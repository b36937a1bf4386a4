"""The trainer's log lines: one prefix a rank, and no credentials of a URL in them.

A rank's log lines end up where many read them (the pod's termination message, hence the
job's status and Events, `kube-ddp logs`): a URL's `user:password@` part, such as a
MLFLOW_TRACKING_URI with basic auth or a library's error that repeats it, is masked in every
line, whichever module logged it."""

from __future__ import annotations

import logging
import re

# scheme://userinfo@ (RFC 3986): the userinfo ends at the first of / ? # @ or a blank
USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")
MASK = "***"


def without_userinfo(text: str) -> str:
    """`text` with each URL's userinfo replaced by ***."""
    return USERINFO.sub(rf"\1{MASK}@", text)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return without_userinfo(super().format(record))


def setup(rank: int) -> None:
    """INFO and above to stderr, each line prefixed with the rank and redacted."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(f"ddp_trainer[rank {rank}]: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
