"""The trainer's log lines carry no credentials of a URL, whichever module logs them."""

from __future__ import annotations

import logging
import sys

import pytest

from ddp_trainer.logs import RedactingFormatter, without_userinfo


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("at http://alice:s3cret@mlflow:5000/api", "at http://***@mlflow:5000/api"),
        ("s3+https://key@host/b and https://u:p@x", "s3+https://***@host/b and https://***@x"),
        ("no url, an address a@b.c", "no url, an address a@b.c"),
        ("http://host/path@v2 stays", "http://host/path@v2 stays"),
        (
            "HTTPConnectionPool(host='h') url: http://t@h:1/",
            "HTTPConnectionPool(host='h') url: http://***@h:1/",
        ),
    ],
)
def test_userinfo_is_masked_and_nothing_else(text: str, shown: str) -> None:
    assert without_userinfo(text) == shown


def test_the_formatter_masks_arguments_and_tracebacks() -> None:
    try:
        raise ConnectionError("cannot reach https://bob:hunter2@tracking/api")
    except ConnectionError:
        record = logging.LogRecord(
            "mlflow", logging.WARNING, __file__, 1, "to %s", ("http://bob:hunter2@t",), None
        )
        record.exc_info = sys.exc_info()
    line = RedactingFormatter("%(message)s").format(record)
    assert "hunter2" not in line
    assert line.startswith("to http://***@t")
