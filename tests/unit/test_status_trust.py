"""Whose status fields are whose (status/trust.py): the operator's record of its own fields wins
over what was read; the pods' reports are taken as read."""

from __future__ import annotations

from datetime import timedelta

from kube_ddp.api import JobStatus
from kube_ddp.status.trust import (
    REPORTED,
    ignored_message,
    overwritten_message,
    owned_fields,
    read_status,
    restore_owned,
)

WRITTEN = JobStatus.model_validate({"phase": "Running", "restarts": 1, "attempt": 1})


def test_the_operators_fields_come_back_and_the_reports_stay() -> None:
    forged = {"phase": "Succeeded", "restarts": 0, "replacing": [2, 3], "attempt": 1}
    read = JobStatus.model_validate({**forged, "training": {"epoch": 4}})
    restored, changed = restore_owned(read, WRITTEN)
    assert changed == ["phase", "replacing", "restarts"]
    assert owned_fields(restored) == owned_fields(WRITTEN)
    assert restored.training == read.training


def test_a_status_as_written_plus_reports_changes_nothing() -> None:
    read = WRITTEN.model_copy(
        update={"training": JobStatus.model_validate({"training": {"epoch": 2}}).training}
    )
    restored, changed = restore_owned(read, WRITTEN)
    assert (restored, changed) == (read, [])


def test_a_field_removed_by_someone_else_is_named() -> None:
    restored, changed = restore_owned(JobStatus.model_validate({"phase": "Running"}), WRITTEN)
    assert changed == ["attempt", "restarts"]
    assert restored.restarts == 1


def test_the_reported_fields_are_never_the_operators() -> None:
    assert not REPORTED & owned_fields(WRITTEN).keys()
    assert {"training", "rank_restart"} <= set(JobStatus.model_fields)
    message = overwritten_message(["phase", "replacing"])
    assert message.startswith("status.phase, status.replacing changed by someone other")


def test_fields_that_are_not_valid_are_dropped_and_named() -> None:
    raw = {
        "phase": "Running",
        "restarts": -1000,
        "replacing": [1, 5000],
        "training": {"epoch": 3, "updatedAt": "2026-11-22T12:00:00"},
        "rankRestart": {"time": "9999-12-31T23:59:59-01:00"},
        "unknownKey": {"anything": 1},
    }
    read, dropped = read_status(raw)
    assert (read.phase, read.restarts, read.replacing, read.training) == ("Running", 0, [], None)
    assert read.rank_restart is None
    assert dropped == {
        "restarts": "status.restarts: Input should be greater than or equal to 0",
        "replacing": "status.replacing.1: Input should be less than 1024",
        "training": "status.training.updatedAt: a time needs a zone (RFC 3339: Z or an offset)",
        "rankRestart": "status.rankRestart.time: a time out of the range of dates",
    }
    message = ignored_message(dropped)
    assert message.startswith("ignored, not valid: status.rankRestart.time: a time out of")
    assert len(ignored_message({str(i): "x" * 100 for i in range(100)})) == 1024


def test_a_status_that_is_not_an_object_reads_as_none() -> None:
    assert read_status("Succeeded") == (JobStatus(), {"": "status: not an object"})
    assert read_status(None) == (JobStatus(), {})


def test_times_are_read_in_utc_whatever_their_zone_or_case() -> None:
    read, dropped = read_status({"training": {"updatedAt": "2026-11-22t13:00:00+01:00"}})
    lower, _ = read_status({"training": {"updatedAt": "2026-11-22T12:00:00z"}})
    assert not dropped and read.training == lower.training
    assert read.training is not None and read.training.updated_at is not None
    assert read.training.updated_at.utcoffset() == timedelta(0)
    assert "training" not in owned_fields(read)  # the report is not the operator's


def test_numbers_are_finite_and_a_save_takes_at_most_a_day() -> None:
    _, dropped = read_status({"training": {"loss": float("nan")}})
    assert dropped == {"training": "status.training.loss: Input should be a finite number"}
    _, dropped = read_status({"training": {"checkpoint": {"saveSeconds": 1e308}}})
    assert "less than or equal to 86400" in dropped["training"]
