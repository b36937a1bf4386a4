"""Whose status fields are whose (status/trust.py): the operator's record of its own fields wins
over what was read; the pods' reports are taken as read."""

from __future__ import annotations

from kube_ddp.api import JobStatus
from kube_ddp.status.trust import REPORTED, overwritten_message, owned_fields, restore_owned

WRITTEN = JobStatus.model_validate({"phase": "Running", "restarts": 1, "attempt": 1})


def test_the_operators_fields_come_back_and_the_reports_stay() -> None:
    forged = {"phase": "Succeeded", "restarts": -1000, "replacing": [2, 3], "attempt": 1}
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
